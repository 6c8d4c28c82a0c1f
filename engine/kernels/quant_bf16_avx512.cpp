// Quantized prefill GEMM with bf16 activations on AVX-512 BF16 (VDPBF16PS), the
// fast config's path for GGUF weights where there is no AMX (kernels/quant.h):
//   y[t][r] = sum_g scale[r,g] * sum_{j in g} (q[r,j] - zero) xb[t,j] + min[r,g] * sum_{j in g}
//   xb[t,j]
// with xb = bf16(x), rounded to nearest even once per call, as the bf16 GEMM
// rounds x. (q - zero) is exact in bf16 and the scales and mins are applied in
// fp32, so no weight is ever rounded: the activations' rounding is the only
// difference from the exact path, and stage 2 judges it.
//
// Each thread unpacks its 16-row panels once per call (quant_panels_avx512.h)
// and sweeps every token over them, 8 tokens x 16 rows per register tile: a
// group's products (16 or 32 columns) are summed by VDPBF16PS in fresh
// registers, then FMA'd into the accumulators with the 16 rows' scales.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/avx512.h"
#include "kernels/quant.h"
#include "kernels/quant_panels_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

using quant_panels::kChunkBytes;
using quant_panels::kPanel;
using quant_panels::PanelView;
using quant_panels::Scratch;

constexpr size_t kTokenBlockBytes = 256 * 1024;  // bf16 x per token block (stays in L2)

struct Call {
  const uint16_t* xb;      // [n][cols] bf16(x)
  const float* block_sum;  // [n][cols / 32] sums of xb where a segment has mins per 32
  const float* half_sum;   // [n][cols / 16] where a segment has mins per 16 (Q2_K)
  size_t n;
};

// Tokens [t, t + T) x the panel's 16 rows (`rows` of them real).
template <int T, int KG, bool kMin>
inline void tile(const PanelView& p, const uint16_t* xb, size_t cols, const float* gsum, float* y,
                 size_t ldy, size_t rows) {
  const size_t ng = cols / KG;
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (size_t g = 0; g < ng; ++g) {
    __m512 part[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) part[t] = _mm512_setzero_ps();
    const uint16_t* w = p.w + g * KG * kPanel;  // the group's column pairs, 64 bytes each
#pragma GCC unroll 16
    for (int q = 0; q < KG / 2; ++q) {
      const __m512bh wv = (__m512bh)_mm512_load_si512(w + q * 32);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        uint32_t pair;
        std::memcpy(&pair, xb + t * cols + g * KG + 2 * q, sizeof(pair));
        part[t] = _mm512_dpbf16_ps(part[t], wv, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
    const __m512 sc = _mm512_loadu_ps(p.scale + g * kPanel);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(part[t], sc, acc[t]);
    if constexpr (kMin) {
      const __m512 mn = _mm512_loadu_ps(p.min + g * kPanel);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(gsum[t * ng + g]), mn, acc[t]);
    }
  }
  const __mmask16 real = rows >= kPanel ? 0xffff : static_cast<__mmask16>((1u << rows) - 1);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, real, acc[t]);
}

// Panels [p0, p1) of segment s for every token.
template <int KG, bool kMin>
void segment_panels(const QuantSegment& s, const Call& call, float* y, size_t ldy, size_t p0,
                    size_t p1, Scratch& scratch) {
  const size_t cols = s.cols, ng = cols / KG;
  const float* gsum = kMin ? (KG == 16 ? call.half_sum : call.block_sum) : nullptr;
  const size_t chunk = std::max<size_t>(1, kChunkBytes / (cols * kPanel * sizeof(uint16_t)));
  const size_t tblock = std::max<size_t>(8, kTokenBlockBytes / (cols * sizeof(uint16_t)) / 8 * 8);
  for (size_t c0 = p0; c0 < p1; c0 += chunk) {
    const size_t c1 = std::min(p1, c0 + chunk);
    scratch.unpack(s, c0, c1 - c0);
    for (size_t t0 = 0; t0 < call.n; t0 += tblock) {
      const size_t t1 = std::min(call.n, t0 + tblock);
      for (size_t p = c0; p < c1; ++p) {
        const PanelView v = scratch.panel(p - c0);
        const size_t r0 = p * kPanel, rows = std::min(kPanel, s.rows - r0);
        auto at = [&](size_t t) {
          return std::tuple{call.xb + t * cols, kMin ? gsum + t * ng : nullptr, y + t * ldy + r0};
        };
        size_t t = t0;
        for (; t + 8 <= t1; t += 8) {
          const auto [x, g, out] = at(t);
          tile<8, KG, kMin>(v, x, cols, g, out, ldy, rows);
        }
        for (; t < t1; ++t) {
          const auto [x, g, out] = at(t);
          tile<1, KG, kMin>(v, x, cols, g, out, ldy, rows);
        }
      }
    }
  }
}

void run_segment(const QuantSegment& s, const Call& call, float* y, size_t ldy, size_t p0,
                 size_t p1) {
  thread_local Scratch scratch;
  if (s.group == 16 && s.has_min)
    segment_panels<16, true>(s, call, y, ldy, p0, p1, scratch);
  else if (s.group == 16)
    segment_panels<16, false>(s, call, y, ldy, p0, p1, scratch);
  else if (s.has_min)
    segment_panels<32, true>(s, call, y, ldy, p0, p1, scratch);
  else
    segment_panels<32, false>(s, call, y, ldy, p0, p1, scratch);
}

// Sums of each `group` consecutive bf16 values of xb, in fp32: out [n][cols / group].
void bf16_group_sums(const uint16_t* xb, size_t n, size_t cols, size_t group, float* out,
                     ThreadPool& pool) {
  const size_t per_token = cols / group;
  pool.parallel_chunks(n, [&](size_t t0, size_t t1) {
    for (size_t i = t0 * per_token; i < t1 * per_token; ++i) {
      __m512 sum = _mm512_setzero_ps();
      for (size_t j = 0; j < group; j += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + i * group + j));
        sum = _mm512_add_ps(sum,
                            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
      out[i] = _mm512_reduce_add_ps(sum);
    }
  });
}

}  // namespace

void quant_matmul_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  const size_t cols = w.cols;
  uint16_t* xb = bf16_scratch(n * cols);
  to_bf16_parts(x, n, cols, n, cols, 1, xb, pool);
  thread_local std::vector<float> sums, halves;
  const bool mins = std::any_of(w.segments.begin(), w.segments.end(),
                                [](const QuantSegment& s) { return s.has_min && s.group == 32; });
  const bool mins16 = std::any_of(w.segments.begin(), w.segments.end(),
                                  [](const QuantSegment& s) { return s.mins_per_16(); });
  if (mins) {
    sums.resize(n * cols / 32);
    bf16_group_sums(xb, n, cols, 32, sums.data(), pool);
  }
  if (mins16) {
    halves.resize(n * cols / 16);
    bf16_group_sums(xb, n, cols, 16, halves.data(), pool);
  }
  const Call call{.xb = xb,
                  .block_sum = mins ? sums.data() : nullptr,
                  .half_sum = mins16 ? halves.data() : nullptr,
                  .n = n};
  // Work items: panels over all segments.
  std::vector<size_t> first;  // per segment, its first panel
  size_t panels = 0;
  for (const QuantSegment& s : w.segments) {
    first.push_back(panels);
    panels += (s.rows + kPanel - 1) / kPanel;
  }
  pool.parallel_chunks(panels, [&](size_t q0, size_t q1) {
    size_t base = 0;  // first row of the segment
    for (size_t i = 0; i < w.segments.size(); ++i) {
      const QuantSegment& s = w.segments[i];
      const size_t count = (s.rows + kPanel - 1) / kPanel;
      const size_t lo = std::max(q0, first[i]), hi = std::min(q1, first[i] + count);
      if (lo < hi) run_segment(s, call, y + base, w.rows, lo - first[i], hi - first[i]);
      base += s.rows;
    }
  });
}

}  // namespace edgellm::kernels::avx512
