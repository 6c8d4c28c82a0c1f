#include "edgellm/roofline.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/avx512.h"
#include "kernels/kernels.h"

namespace edgellm {

namespace {

using Clock = std::chrono::steady_clock;

// Reads [begin, end) with 4 independent AVX2 accumulators so the loads, not
// the adds, are the limit. Compiled for AVX2 only here; callers check cpuid.
__attribute__((target("avx2"))) float read_sum_avx2(const float* begin, const float* end) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (const float* p = begin; p + 32 <= end; p += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(p));
    b = _mm256_add_ps(b, _mm256_load_ps(p + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(p + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(p + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return out[0] + out[7];
}

float read_sum_scalar(const float* begin, const float* end) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (const float* p = begin; p + 4 <= end; p += 4) {
    s0 += p[0];
    s1 += p[1];
    s2 += p[2];
    s3 += p[3];
  }
  return s0 + s1 + s2 + s3;
}

// 10 independent FMA chains per thread hide the FMA latency (4 cycles x 2 ports).
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iterations) {
  __m256 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), k = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
    for (auto& v : acc) v = _mm256_fmadd_ps(v, m, k);
  float out[8], s = 0;
  for (auto& v : acc) {
    _mm256_storeu_ps(out, v);
    s += out[0];
  }
  return s;
}

template <typename Fn>
double best_seconds(int threads, int repeats, Fn&& per_thread) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    std::vector<std::thread> pool;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { per_thread(t); });
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// 24 independent vdpbf16ps chains (each 16 lanes x 2 products = 64 flops;
// 12 left the latency exposed on Zen 5):
// the avx512 GEMM's instruction (matmul_avx512.cpp).
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(int64_t iterations) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;  // bf16 pairs (1, 1)
  for (int64_t it = 0; it < iterations; ++it) {
    // Unrolled so the accumulators live in registers, not in memory.
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float out[16], s = 0;
  for (auto& v : acc) {
    _mm512_storeu_ps(out, v);
    s += out[0];
  }
  return s;
}

// 24 independent 16-lane FMA chains: the avx512 GEMM's instruction at fp32
// precision (matmul_avx512.cpp runs FMAs on fp32 x, not vdpbf16ps).
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iterations) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), k = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, k);
  }
  float out[16], s = 0;
  for (auto& v : acc) {
    _mm512_storeu_ps(out, v);
    s += out[0];
  }
  return s;
}

// The AMX GEMM's inner step (matmul_amx.cpp): four TDPBF16PS (16 x 16 x 32 x
// 2 = 16384 flops each) on tiles loaded once. Needs the tile permission,
// which detect_isa() requested before it reported Isa::amx.
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(int64_t iterations) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } cfg;
  alignas(64) static const uint16_t ones[16 * 32] = {};
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

}  // namespace

double measure_read_bandwidth(size_t bytes, int threads) {
  threads = std::max(1, threads);
  const bool avx2 = kernels::detect_isa() >= kernels::Isa::avx2;
  const size_t n = std::max<size_t>(bytes / sizeof(float) / 64 * 64, 64);
  std::unique_ptr<float[], void (*)(void*)> buf(
      static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))), std::free);
  std::memset(buf.get(), 0, n * sizeof(float));  // fault the pages in before timing
  volatile float sink = 0;
  const double seconds = best_seconds(threads, 3, [&](int t) {
    // Chunk boundaries rounded to 32 floats keep the AVX2 loads aligned.
    const float* b = buf.get() + n / 32 * t / threads * 32;
    const float* e = buf.get() + n / 32 * (t + 1) / threads * 32;
    sink = sink + (avx2 ? read_sum_avx2(b, e) : read_sum_scalar(b, e));
  });
  return n * sizeof(float) / seconds / 1e9;
}

double measure_fma_peak(int threads) {
  threads = std::max(1, threads);
  if (kernels::detect_isa() < kernels::Isa::avx2) return 0.0;  // avx2 tier = AVX2 + FMA
  const int64_t iters = 20'000'000;
  volatile float sink = 0;
  const double seconds = best_seconds(threads, 3, [&](int) { sink = sink + fma_loop_avx2(iters); });
  return static_cast<double>(threads) * iters * 10 * 8 * 2 / seconds / 1e9;
}

double measure_matmul_peak(int threads, kernels::Isa isa, kernels::GemmPrecision precision) {
  threads = std::max(1, threads);
  volatile float sink = 0;
  switch (isa) {
    case kernels::Isa::scalar:
      return 0.0;
    case kernels::Isa::avx2:
      return measure_fma_peak(threads);
    case kernels::Isa::avx512: {
      const int64_t iters = 10'000'000;
      if (precision != kernels::GemmPrecision::bf16) {  // fp32 x: FMAs
        const double s =
            best_seconds(threads, 3, [&](int) { sink = sink + fma_loop_avx512(iters); });
        return static_cast<double>(threads) * iters * 24 * 32 / s / 1e9;
      }
      const double s = best_seconds(threads, 3, [&](int) { sink = sink + dpbf16_loop(iters); });
      return static_cast<double>(threads) * iters * 24 * 64 / s / 1e9;
    }
    case kernels::Isa::amx: {
      const int64_t iters = 500'000;
      const double s = best_seconds(threads, 3, [&](int) { sink = sink + amx_loop(iters); });
      return static_cast<double>(threads) * iters * 4 * 16384 / s / 1e9;
    }
  }
  return 0.0;
}

Roofline measure_roofline(int threads, const kernels::ExecConfig& cfg) {
  // 512 MiB: far beyond the caches, like a decode step's weight stream.
  // On amx every precision runs TDPBF16PS, once per bf16 part of x.
  const double passes = cfg.isa == kernels::Isa::amx ? kernels::amx::amx_parts(cfg.gemm) : 1;
  return Roofline{measure_read_bandwidth(size_t{512} << 20, threads),
                  measure_matmul_peak(threads, cfg.isa, cfg.gemm), kernels::isa_name(cfg.isa),
                  passes};
}

Roofline measure_roofline(int threads) {
  return measure_roofline(threads, kernels::process_exec_config());
}

}  // namespace edgellm
