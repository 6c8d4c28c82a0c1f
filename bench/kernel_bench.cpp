// Rough throughput of the hot kernels against this machine's own ceilings,
// measured in the same run: memory read bandwidth for the decode GEMV, the
// active tier's GEMM-instruction peak for the prefill GEMM (fp32 FMA on avx2,
// vdpbf16ps on avx512, TDPBF16PS on amx; EDGELLM_ISA picks the tier), and the
// thread pool's per-op cost. Prints one
// line per measurement; numbers drift on shared machines, ratios hold.
//
//   kernel_bench [--threads N] [--quick] [--attention | --attention-prefill | --gemm |
//                 --gemm-shapes [--models a,b] [--tokens 128,512]]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "edgellm/bf16.h"
#include "edgellm/roofline.h"
#include "edgellm/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

using namespace edgellm;
using namespace edgellm::kernels;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median wall time of fn over `reps` runs after one warm-up run.
template <typename Fn>
double median_time(int reps, Fn&& fn) {
  fn();
  std::vector<double> t(static_cast<size_t>(reps));
  for (auto& s : t) {
    const auto t0 = Clock::now();
    fn();
    s = seconds_since(t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// --- ceilings: measured by the engine's own roofline (engine/src/runtime/roofline.cpp) ---

// --- kernels ------------------------------------------------------------------

struct Shape {
  const char* what;
  size_t n, rows, cols;
};

struct MatmulResult {
  double seconds, gflops, gbytes;
};

MatmulResult bench_matmul(size_t n, size_t rows, size_t cols, Isa isa, ThreadPool& pool, int reps) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> w(rows * cols);
  for (auto& e : w) e = float_to_bf16(dist(rng));
  const PackedMatrix m = pack_matrix(w.data(), rows, cols, isa);
  std::vector<float> x(n * cols), y(n * rows);
  for (auto& e : x) e = dist(rng);
  const double t = median_time(reps, [&] { matmul(m, x.data(), n, y.data(), pool); });
  return {t, 2.0 * n * rows * cols / t / 1e9, m.byte_size() / t / 1e9};
}

// GEMV streaming from DRAM: cycles through enough distinct copies of the
// matrix (> 1 GiB together) that none is still cached, as decode does when
// the model is larger than the last-level cache.
double bench_gemv_cold(size_t rows, size_t cols, Isa isa, ThreadPool& pool, size_t copies) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> w(rows * cols);
  for (auto& e : w) e = float_to_bf16(dist(rng));
  std::vector<PackedMatrix> ms;
  for (size_t i = 0; i < copies; ++i) ms.push_back(pack_matrix(w.data(), rows, cols, isa));
  std::vector<float> x(cols), y(rows);
  for (auto& e : x) e = dist(rng);
  for (const auto& m : ms) matmul(m, x.data(), 1, y.data(), pool);
  const auto t0 = Clock::now();
  for (int pass = 0; pass < 3; ++pass)
    for (const auto& m : ms) matmul(m, x.data(), 1, y.data(), pool);
  const double t = seconds_since(t0) / (3.0 * copies);
  return ms[0].byte_size() / t / 1e9;
}

// Quantized GEMV/GEMM (kernels/quant.h) on random GGUF-format blocks. GEMV
// streams from DRAM (distinct copies, > 256 MB together); GB/s counts the
// bytes the repacked layout streams, GFLOP/s 2 n rows cols.
QuantMatrix random_quant(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  std::vector<uint8_t> blocks(rows * cols / block_elems(f) * block_bytes(f));
  for (auto& b : blocks) b = static_cast<uint8_t>(rng() & 0x3b);  // keeps f16 scales finite
  QuantMatrix m;
  append_segment(m, repack_gguf(f, blocks.data(), rows, cols));
  return m;
}

MatmulResult bench_quant(BlockFormat f, size_t n, size_t rows, size_t cols, size_t copies,
                         ThreadPool& pool, int reps) {
  std::mt19937 rng(4);
  std::vector<QuantMatrix> ms;
  for (size_t i = 0; i < copies; ++i) ms.push_back(random_quant(f, rows, cols, rng));
  std::vector<float> x(n * cols), y(n * rows);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& e : x) e = dist(rng);
  size_t next = 0;
  const double t = median_time(reps, [&] {
    quant_matmul(ms[next], x.data(), n, y.data(), nullptr, pool);
    next = (next + 1) % copies;
  });
  return {t, 2.0 * n * rows * cols / t / 1e9, ms[0].bytes() / t / 1e9};
}

double bench_attention(size_t n, size_t start, size_t heads, size_t kv, size_t hd, ThreadPool& pool,
                       KvDtype dtype = KvDtype::fp32) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t stride = start + n;
  std::vector<float> q(n * heads * hd), k(kv * stride * hd), v(kv * stride * hd), out(q.size());
  for (auto* vec : {&q, &k, &v})
    for (auto& e : *vec) e = dist(rng);
  AttentionArgs a;
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.out = out.data();
  a.n = n;
  a.start = start;
  a.n_heads = heads;
  a.n_kv_heads = kv;
  a.head_dim = hd;
  a.cache_stride = stride;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<uint16_t> k16, v16;
  if (dtype == KvDtype::bf16) {
    for (auto [src, dst] : {std::pair{&k, &k16}, std::pair{&v, &v16}})
      for (float e : *src) dst->push_back(float_to_bf16(e));
    a.k_cache = k16.data();
    a.v_cache = v16.data();
    a.kv_dtype = dtype;
  }
  return median_time(21, [&] { attention(a, pool); });
}

// Decode attention at `start` keys over `layers` caches (one per layer, as a
// model streams them from DRAM) of the given dtype: (us per layer, GB/s of K/V
// read, scales included).
std::pair<double, double> bench_decode_attention(size_t start, size_t heads, size_t kv, size_t hd,
                                                 size_t layers, KvDtype dtype, ThreadPool& pool) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const size_t stride = start + 1, elems = kv * stride * hd;
  std::vector<float> q(heads * hd), out(q.size());
  for (auto& e : q) e = dist(rng);
  // Per layer: K and V as the dtype stores them, scales (q8_0) after.
  struct Layer {
    std::vector<float> k32, v32;
    std::vector<uint16_t> k16, v16, ks, vs;
    std::vector<int8_t> k8, v8;
  };
  std::vector<Layer> cache(layers);
  std::vector<float> k(elems), v(elems);
  for (Layer& c : cache) {
    for (auto* x : {&k, &v})
      for (auto& e : *x) e = dist(rng);
    if (dtype == KvDtype::bf16) {
      for (auto [src, dst] : {std::pair{&k, &c.k16}, std::pair{&v, &c.v16}}) {
        dst->resize(elems);
        for (size_t i = 0; i < elems; ++i) (*dst)[i] = float_to_bf16((*src)[i]);
      }
    } else if (dtype == KvDtype::q8_0) {
      c.k8.resize(elems);
      c.v8.resize(elems);
      c.ks.resize(elems / kKvQ8Block);
      c.vs.resize(elems / kKvQ8Block);
      quantize_kv_q8_0(k.data(), elems, c.k8.data(), c.ks.data());
      quantize_kv_q8_0(v.data(), elems, c.v8.data(), c.vs.data());
    } else {
      c.k32 = k;
      c.v32 = v;
    }
  }
  AttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.n = 1;
  a.start = start;
  a.n_heads = heads;
  a.n_kv_heads = kv;
  a.head_dim = hd;
  a.cache_stride = stride;
  a.kv_dtype = dtype;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const double t = median_time(7, [&] {
    for (const Layer& c : cache) {
      a.k_cache = dtype == KvDtype::bf16   ? static_cast<const void*>(c.k16.data())
                  : dtype == KvDtype::q8_0 ? static_cast<const void*>(c.k8.data())
                                           : c.k32.data();
      a.v_cache = dtype == KvDtype::bf16   ? static_cast<const void*>(c.v16.data())
                  : dtype == KvDtype::q8_0 ? static_cast<const void*>(c.v8.data())
                                           : c.v32.data();
      a.k_scale = c.ks.data();
      a.v_scale = c.vs.data();
      attention(a, pool);
    }
  });
  const double bytes = 2.0 * layers * static_cast<double>(kv_bytes(dtype, elems));
  return {t / layers * 1e6, bytes / t / 1e9};
}

// Seconds of CPU time this process has used, every thread.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Prefill attention of one shape at both precisions (AttnPrecision), timed
// alternately (fp32, bf16, fp32, ...) so that a shared machine's drift hits
// both alike: median wall and process-CPU seconds of each. On a shared
// machine CPU time is the steadier measure (the pool's spin-waits count in
// it, time other processes take does not).
struct PrefillShape {
  const char* what;
  size_t heads, kv, hd, window;
};

struct PrecisionTimes {
  double wall[2], cpu[2];  // [fp32, bf16]
};

PrecisionTimes bench_prefill_precisions(const PrefillShape& s, size_t n, KvDtype dtype, int reps,
                                        ThreadPool& pool) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(n * s.heads * s.hd), k(s.kv * n * s.hd), v(k.size()), out(q.size());
  for (auto* vec : {&q, &k, &v})
    for (auto& e : *vec) e = dist(rng);
  std::vector<uint16_t> k16, v16;
  AttentionArgs a;
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  if (dtype == KvDtype::bf16) {
    for (auto [src, dst] : {std::pair{&k, &k16}, std::pair{&v, &v16}})
      for (float e : *src) dst->push_back(float_to_bf16(e));
    a.k_cache = k16.data();
    a.v_cache = v16.data();
  }
  a.kv_dtype = dtype;
  a.out = out.data();
  a.n = n;
  a.n_heads = s.heads;
  a.n_kv_heads = s.kv;
  a.head_dim = s.hd;
  a.cache_stride = n;
  a.window = s.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  std::vector<double> wall[2], cpu[2];
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    for (int p = 0; p < 2; ++p) {
      a.precision = p ? AttnPrecision::bf16 : AttnPrecision::fp32;
      const double c0 = process_cpu_seconds();
      const auto t0 = Clock::now();
      attention(a, pool);
      if (r < 0) continue;
      wall[p].push_back(seconds_since(t0));
      cpu[p].push_back(process_cpu_seconds() - c0);
    }
  }
  PrecisionTimes t;
  for (int p = 0; p < 2; ++p) {
    for (auto* v : {&wall[p], &cpu[p]}) std::sort(v->begin(), v->end());
    t.wall[p] = wall[p][wall[p].size() / 2];
    t.cpu[p] = cpu[p][cpu[p].size() / 2];
  }
  return t;
}

// SmolLM2's and Gemma 3's prefill attention at 512 to 4096 tokens, fp32 vs
// bf16 precision on both cache dtypes: wall ms, GFLOP/s of attention_flops()
// against the fp32 FMA and vdpbf16ps peaks (best of three measurements each),
// and the speedup in wall and in process CPU time (the steadier of the two
// when other processes share the cores).
void attention_prefill_benches(ThreadPool& pool) {
  const Isa isa = active_isa();
  const GemmPrecision saved = gemm_precision();
  double fma_peak = 0.0, bf16_peak = 0.0;
  for (int i = 0; i < 3; ++i) {
    fma_peak = std::max(
        fma_peak,
        edgellm::measure_matmul_peak(pool.size(), std::min(isa, Isa::avx512), GemmPrecision::fp32));
    if (isa >= Isa::avx512)
      bf16_peak = std::max(
          bf16_peak, edgellm::measure_matmul_peak(pool.size(), Isa::avx512, GemmPrecision::bf16));
  }
  set_gemm_precision(saved);
  std::printf("attn  prefill, %s, %d threads: fp32 FMA peak %.1f GFLOP/s, vdpbf16ps peak %.1f\n",
              std::string(isa_name(isa)).c_str(), pool.size(), fma_peak, bf16_peak);
  static const PrefillShape shapes[] = {{"smollm2 9/3x64", 9, 3, 64, 0},
                                        {"gemma3 global 4/1x256", 4, 1, 256, 0},
                                        {"gemma3 local 4/1x256 w512", 4, 1, 256, 512}};
  for (const PrefillShape& s : shapes) {
    for (size_t n : {512, 2048, 4096}) {
      AttentionArgs shape;
      shape.n = n;
      shape.n_heads = s.heads;
      shape.head_dim = s.hd;
      shape.window = s.window;
      const double flops = attention_flops(shape);
      for (KvDtype d : {KvDtype::fp32, KvDtype::bf16}) {
        const int reps = n <= 512 ? 21 : n <= 2048 ? 9 : 5;
        const PrecisionTimes t = bench_prefill_precisions(s, n, d, reps, pool);
        const double g32 = flops / t.wall[0] / 1e9, g16 = flops / t.wall[1] / 1e9;
        std::printf(
            "attn  prefill %-25s n=%-4zu %-4s cache: fp32 %7.2f ms %6.1f GFLOP/s (%3.0f%% of FMA) "
            "| bf16 %7.2f ms %6.1f GFLOP/s (%3.0f%% of vdpbf16ps) | x%.2f wall, x%.2f cpu\n",
            s.what, n, std::string(kv_dtype_name(d)).c_str(), t.wall[0] * 1e3, g32,
            100.0 * g32 / fma_peak, t.wall[1] * 1e3, g16,
            bf16_peak > 0 ? 100.0 * g16 / bf16_peak : 0.0, t.wall[0] / t.wall[1],
            t.cpu[0] / t.cpu[1]);
        std::fflush(stdout);
      }
    }
  }
}

// Per-op cost of the pool. "empty": two trivial items (the caller may well
// run both before the worker looks). "rendezvous": each of two items waits
// until the other has started, so both threads must take part: the round
// trip a decode op pays when it really runs on two cores.
void bench_pool(ThreadPool& pool) {
  constexpr int kOps = 20000;
  std::atomic<int> sink{0};
  auto empty = [&](size_t i) { sink.fetch_add(static_cast<int>(i), std::memory_order_relaxed); };
  for (int i = 0; i < 1000; ++i) pool.parallel_for(2, empty);
  auto t0 = Clock::now();
  for (int i = 0; i < kOps; ++i) pool.parallel_for(2, empty);
  const double empty_us = seconds_since(t0) / kOps * 1e6;

  double rendezvous_us = 0.0;
  if (pool.size() >= 2) {
    std::atomic<int> arrived{0};
    int target = 0;
    auto meet = [&](size_t) {
      arrived.fetch_add(1, std::memory_order_acq_rel);
      while (arrived.load(std::memory_order_acquire) < target) {
      }
    };
    t0 = Clock::now();
    for (int i = 0; i < kOps; ++i) {
      target += 2;
      pool.parallel_for(2, meet);
    }
    rendezvous_us = seconds_since(t0) / kOps * 1e6;
  }
  std::printf("pool  %d threads: parallel_for(2) empty %.3f us/op, both threads %.3f us/op\n",
              pool.size(), empty_us, rendezvous_us);
}

}  // namespace

void attention_benches(ThreadPool& pool, bool with_bandwidth) {
  std::printf("attn  decode smollm2 (9/3 x 64) at 1024 keys: %.1f us\n",
              bench_attention(1, 1023, 9, 3, 64, pool) * 1e6);
  std::printf("attn  decode gemma3 (4/1 x 256) at 1024 keys: %.1f us\n",
              bench_attention(1, 1023, 4, 1, 256, pool) * 1e6);
  // A few tokens at once (batched server, speculative verification).
  std::printf("attn  decode smollm2 (9/3 x 64), 4 tokens at 1024 keys: %.1f us\n",
              bench_attention(4, 1020, 9, 3, 64, pool) * 1e6);
  if (with_bandwidth)
    std::printf("read bandwidth %.1f GB/s\n", measure_roofline(pool.size()).read_gb_per_s);
  // 30 layers (SmolLM2; Gemma 3 270M has 18) stream from DRAM as decode does;
  // one layer (SmolLM2: 1.6-6 MB) stays in cache, which shows the kernel's
  // arithmetic bound.
  struct DecodeShape {
    const char* name;
    size_t heads, kv, hd, layers;
  };
  for (const DecodeShape& sh : {DecodeShape{"smollm2 (9/3 x 64)", 9, 3, 64, 30},
                                DecodeShape{"gemma3 (4/1 x 256)", 4, 1, 256, 18}}) {
    for (size_t layers : {sh.layers, size_t{1}}) {
      for (KvDtype d : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
        const auto [us, gbs] =
            bench_decode_attention(4095, sh.heads, sh.kv, sh.hd, layers, d, pool);
        std::printf("attn  decode %s at 4096 keys, %s cache, %s: %.1f us/layer, %.1f GB/s\n",
                    sh.name, std::string(kv_dtype_name(d)).c_str(),
                    layers > 1 ? (std::to_string(layers) + " layers from DRAM").c_str()
                               : "1 layer from cache",
                    us, gbs);
      }
    }
  }
  for (KvDtype d : {KvDtype::fp32, KvDtype::bf16}) {
    const std::string cache = std::string(kv_dtype_name(d)) + " cache";
    for (size_t n : {128, 256, 512, 1024}) {
      const double tp = bench_attention(n, 0, 9, 3, 64, pool, d);
      std::printf("attn  prefill smollm2 %zu tokens, %s: %.1f us (%.1f GFLOP/s causal)\n", n,
                  cache.c_str(), tp * 1e6, 4.0 * 9 * 64 * (n * (n + 1.0) / 2) / tp / 1e9);
    }
    const double tg = bench_attention(512, 0, 4, 1, 256, pool, d);
    std::printf("attn  prefill gemma3 512 tokens, %s: %.1f us (%.1f GFLOP/s causal)\n",
                cache.c_str(), tg * 1e6, 4.0 * 4 * 256 * (512 * 513.0 / 2) / tg / 1e9);
  }
}

// Prefill GEMMs against the tile/FMA peak. `projections`: the SmolLM2 and
// Llama-3.2-1B prefill projections at 512 and 2048 tokens (kernel_bench --gemm).
void gemm_benches(Isa isa, ThreadPool& pool, ThreadPool& one, double peak, double peak1, bool quick,
                  bool projections) {
  static const Shape mixed[] = {
      {"gate smollm2", 128, 1536, 576},    {"down smollm2", 128, 576, 1536},
      {"gate_up smollm2", 128, 3072, 576}, {"gate_up smollm2", 512, 3072, 576},
      {"qkv smollm2", 512, 960, 576},      {"llama down", 128, 2048, 8192}};
  static const Shape projs[] = {
      {"qkv smollm2", 512, 960, 576},        {"o smollm2", 512, 576, 576},
      {"gate_up smollm2", 512, 3072, 576},   {"down smollm2", 512, 576, 1536},
      {"qkv smollm2", 2048, 960, 576},       {"o smollm2", 2048, 576, 576},
      {"gate_up smollm2", 2048, 3072, 576},  {"down smollm2", 2048, 576, 1536},
      {"qkv llama1b", 512, 3072, 2048},      {"o llama1b", 512, 2048, 2048},
      {"gate_up llama1b", 512, 16384, 2048}, {"down llama1b", 512, 2048, 8192},
      {"gate_up llama1b", 2048, 16384, 2048}};
  const Shape* begin = projections ? projs : mixed;
  const Shape* end = projections ? std::end(projs) : std::end(mixed);
  for (const Shape* s = begin; s != end; ++s) {
    if (quick && s->cols > 4096) continue;
    const MatmulResult r = bench_matmul(s->n, s->rows, s->cols, isa, pool, quick ? 3 : 7);
    const MatmulResult r1 = bench_matmul(s->n, s->rows, s->cols, isa, one, quick ? 3 : 7);
    std::printf(
        "gemm  %-16s n=%-4zu %5zux%-5zu %8.1f us  %6.1f GFLOP/s (%.0f%% of peak); 1 thread %.1f "
        "GFLOP/s (%.0f%%)\n",
        s->what, s->n, s->rows, s->cols, r.seconds * 1e6, r.gflops, 100.0 * r.gflops / peak,
        r1.gflops, 100.0 * r1.gflops / peak1);
    std::fflush(stdout);
  }
}

// The prefill projections of the supported models, as weights.cpp packs them
// (q/k/v fused, gate/up fused), at 128, 512 and 2048 tokens
// (kernel_bench --gemm-shapes [--models a,b] [--tokens 128,512]).
void model_gemm_benches(Isa isa, ThreadPool& pool, double peak, const std::string& models,
                        const std::string& tokens, bool quick) {
  struct ModelShape {
    const char *model, *what;
    size_t rows, cols;
  };
  static const ModelShape shapes[] = {
      {"smollm2", "qkv", 960, 576},        {"smollm2", "o", 576, 576},
      {"smollm2", "gate_up", 3072, 576},   {"smollm2", "down", 576, 1536},
      {"gemma3", "qkv", 1536, 640},        {"gemma3", "o", 640, 1024},
      {"gemma3", "gate_up", 4096, 640},    {"gemma3", "down", 640, 2048},
      {"llama1b", "qkv", 3072, 2048},      {"llama1b", "o", 2048, 2048},
      {"llama1b", "gate_up", 16384, 2048}, {"llama1b", "down", 2048, 8192}};
  auto listed = [](const std::string& list, const std::string& item) {
    return list.empty() || ("," + list + ",").find("," + item + ",") != std::string::npos;
  };
  for (size_t n : {128, 512, 2048}) {
    if (!listed(tokens, std::to_string(n))) continue;
    for (const ModelShape& s : shapes) {
      if (!listed(models, s.model)) continue;
      const double flop = 2.0 * n * s.rows * s.cols;
      // Enough repetitions for ~0.5 s of work per shape, 3 to 15.
      const int reps = quick ? 3 : std::clamp(static_cast<int>(0.5 * peak * 1e9 / flop), 3, 15);
      const MatmulResult r = bench_matmul(n, s.rows, s.cols, isa, pool, reps);
      std::printf("gemm  %-8s %-8s n=%-5zu %5zux%-5zu %9.1f us %7.1f GFLOP/s (%.1f%% of peak)\n",
                  s.model, s.what, n, s.rows, s.cols, r.seconds * 1e6, r.gflops,
                  100.0 * r.gflops / peak);
      std::fflush(stdout);
    }
  }
}

int main(int argc, char** argv) {
  int threads = 0;
  bool quick = false, attention_only = false, gemm_only = false, prefill_only = false,
       model_shapes = false;
  std::string models, tokens;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--models") == 0 && i + 1 < argc)
      models = argv[++i];
    else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
      tokens = argv[++i];
    else if (std::strcmp(argv[i], "--gemm-shapes") == 0)
      model_shapes = true;
    else if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--attention") == 0)
      attention_only = true;
    else if (std::strcmp(argv[i], "--gemm") == 0)
      gemm_only = true;
    else if (std::strcmp(argv[i], "--attention-prefill") == 0)
      prefill_only = true;
    else {
      std::fprintf(stderr,
                   "usage: kernel_bench [--threads N] [--quick] [--attention | "
                   "--attention-prefill | --gemm | --gemm-shapes [--models a,b] [--tokens "
                   "128,512]]\n");
      return 2;
    }
  }
  ThreadPool pool(threads);
  if (attention_only || prefill_only) {
    if (attention_only) attention_benches(pool, true);
    attention_prefill_benches(pool);
    return 0;
  }
  ThreadPool one(1);
  const Isa isa = active_isa();
  std::printf("isa %s, prefill GEMM activations %s, %d threads\n",
              std::string(isa_name(isa)).c_str(),
              std::string(gemm_precision_name(gemm_precision())).c_str(), pool.size());
  // The read-bandwidth ceiling is measured with AVX2 loops.
  if (detect_isa() < Isa::avx2) {
    std::printf("no AVX2 on this CPU: nothing to measure against\n");
    return 0;
  }

  const int reps = quick ? 5 : 21;
  if (!gemm_only) bench_pool(pool);

  // The peak of the instruction the GEMM issues at this precision (roofline.h):
  // AVX-512 FMAs for fp32 on avx512; TDPBF16PS on amx at every precision
  // (fp32 runs 3 passes, so at most 33% of it in useful flops).
  const Isa peak_isa = isa;
  const double peak1 = edgellm::measure_matmul_peak(one.size(), peak_isa, gemm_precision()),
               peak = edgellm::measure_matmul_peak(pool.size(), peak_isa, gemm_precision());
  std::printf("ceiling  %s GEMM peak: %.1f GFLOP/s (1 thread), %.1f GFLOP/s (%d threads)\n",
              std::string(isa_name(peak_isa)).c_str(), peak1, peak, pool.size());
  if (model_shapes) {
    model_gemm_benches(isa, pool, peak, models, tokens, quick);
    return 0;
  }
  if (gemm_only) {
    gemm_benches(isa, pool, one, peak, peak1, quick, true);
    return 0;
  }
  const size_t gemv_bytes = 49152ull * 576 * 2;
  const double bw_l = edgellm::measure_read_bandwidth(gemv_bytes, pool.size());
  const double bw_big = edgellm::measure_read_bandwidth(size_t{1} << 30, pool.size());
  std::printf(
      "ceiling  read bandwidth: %.1f GB/s over %.0f MB (the GEMV's size), %.1f GB/s over 1 GiB\n",
      bw_l, gemv_bytes / 1e6, bw_big);

  const Shape gemvs[] = {{"lm_head smollm2", 1, 49152, 576},
                         {"gate_up smollm2", 1, 3072, 576},
                         {"down smollm2", 1, 576, 1536},
                         {"qkv smollm2", 1, 960, 576}};
  for (const Shape& s : gemvs) {
    const MatmulResult r = bench_matmul(s.n, s.rows, s.cols, isa, pool, reps);
    std::printf("gemv  %-16s %6zux%-5zu %8.1f us  %6.1f GB/s (%.0f%% of read bw)\n", s.what, s.rows,
                s.cols, r.seconds * 1e6, r.gbytes,
                100.0 * r.gbytes / (s.rows * s.cols * 2 > (64u << 20) ? bw_big : bw_l));
  }
  const double cold = bench_gemv_cold(49152, 576, isa, pool, quick ? 6 : 20);
  std::printf("gemv  lm_head smollm2 from DRAM (%d copies): %6.1f GB/s (%.0f%% of 1 GiB read bw)\n",
              quick ? 6 : 20, cold, 100.0 * cold / bw_big);
  gemm_benches(isa, pool, one, peak, peak1, quick, false);

  struct QuantShape {
    const char* what;
    BlockFormat format;
    size_t rows, cols;
  };
  const QuantShape quants[] = {{"gate_up smollm2", BlockFormat::q4_1, 3072, 576},
                               {"down smollm2", BlockFormat::q4_1, 576, 1536},
                               {"lm_head smollm2", BlockFormat::q8_0, 49152, 576},
                               {"qkv gemma3", BlockFormat::q5_0, 1536, 640},
                               {"down gemma3", BlockFormat::q4_k, 640, 2048},
                               {"down gemma3", BlockFormat::q6_k, 640, 2048}};
  for (const QuantShape& q : quants) {
    std::mt19937 rng(0);
    const size_t bytes = random_quant(q.format, q.rows, q.cols, rng).bytes();
    const size_t copies = std::max<size_t>(2, (size_t{256} << 20) / bytes);
    const MatmulResult v = bench_quant(q.format, 1, q.rows, q.cols, copies, pool, reps * 8);
    const MatmulResult g = bench_quant(q.format, 128, q.rows, q.cols, 1, pool, quick ? 3 : 7);
    std::printf(
        "quant %-16s %-4s %5zux%-5zu gemv from DRAM %6.1f GB/s (%.0f%% of 1 GiB read bw); "
        "gemm n=128 %6.1f GFLOP/s (%.0f%% of fp32 FMA peak)\n",
        q.what, std::string(block_format_name(q.format)).c_str(), q.rows, q.cols, v.gbytes,
        100.0 * v.gbytes / bw_big, g.gflops, 100.0 * g.gflops / peak);
  }

  attention_benches(pool, false);
  if (!quick) attention_prefill_benches(pool);
  return 0;
}
