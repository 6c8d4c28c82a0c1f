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
// and sweeps every token over them, 7 tokens x 32 rows (two panels) per
// register tile: a group's products (16 or 32 columns) are summed by VDPBF16PS
// in fresh registers, then FMA'd into the accumulators with the rows' scales.
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
constexpr int kTokens = 7;                       // tokens of a register tile
constexpr int kPanels = 2;                       // panels of a register tile

struct Call {
  const uint16_t* xb;      // [n][cols] bf16(x)
  const float* block_sum;  // [n][cols / 32] sums of xb where a segment has mins per 32
  const float* half_sum;   // [n][cols / 16] where a segment has mins per 16 (Q2_K)
  size_t n;
};

// Tokens [t, t + T) x P adjacent panels' 16 rows each (`rows` of them real,
// counted from the first panel's first row). T * P independent VDPBF16PS
// chains: with 8 (8 tokens x 1 panel) the instruction's latency, not its
// throughput, was the limit (~65% of the peak on Zen 5); 7 x 2 keeps 14 in
// flight (28 accumulators and two weight vectors of the 32 zmm registers),
// and each broadcast of x feeds P of them.
template <int T, int P, int KG, bool kMin>
inline void tile(const PanelView* p, const uint16_t* xb, size_t cols, const float* gsum, float* y,
                 size_t ldy, size_t rows) {
  const size_t ng = cols / KG;
  __m512 acc[T][P];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
    for (int k = 0; k < P; ++k) acc[t][k] = _mm512_setzero_ps();
  for (size_t g = 0; g < ng; ++g) {
    __m512 part[T][P];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
      for (int k = 0; k < P; ++k) part[t][k] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int q = 0; q < KG / 2; ++q) {
      __m512bh wv[P];  // the group's column pair q of each panel, 64 bytes
#pragma GCC unroll 2
      for (int k = 0; k < P; ++k)
        wv[k] = (__m512bh)_mm512_load_si512(p[k].w + g * KG * kPanel + q * 32);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        uint32_t pair;
        std::memcpy(&pair, xb + t * cols + g * KG + 2 * q, sizeof(pair));
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 2
        for (int k = 0; k < P; ++k) part[t][k] = _mm512_dpbf16_ps(part[t][k], wv[k], xv);
      }
    }
#pragma GCC unroll 2
    for (int k = 0; k < P; ++k) {
      const __m512 sc = _mm512_loadu_ps(p[k].scale + g * kPanel);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[t][k] = _mm512_fmadd_ps(part[t][k], sc, acc[t][k]);
    }
    if constexpr (kMin) {
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512 s = _mm512_set1_ps(gsum[t * ng + g]);
#pragma GCC unroll 2
        for (int k = 0; k < P; ++k)
          acc[t][k] = _mm512_fmadd_ps(s, _mm512_loadu_ps(p[k].min + g * kPanel), acc[t][k]);
      }
    }
  }
#pragma GCC unroll 2
  for (int k = 0; k < P; ++k) {
    const size_t left = rows > k * kPanel ? rows - k * kPanel : 0;
    const __mmask16 real = left >= kPanel ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy + k * kPanel, real, acc[t][k]);
  }
}

// Tokens [t0, t1) x P panels in tiles of kTokens, the last tile narrower: a
// 1-token tile has only P chains, so the tail gets a tile of its own width.
template <int T, int P, int KG, bool kMin>
inline void tiles(const PanelView* v, const uint16_t* xb, size_t cols, const float* gsum, float* y,
                  size_t ldy, size_t rows, size_t t0, size_t t1) {
  const size_t ng = cols / KG;
  auto x = [&](size_t t) { return xb + t * cols; };
  auto g = [&](size_t t) { return kMin ? gsum + t * ng : nullptr; };
  size_t t = t0;
  for (; t + T <= t1; t += T) tile<T, P, KG, kMin>(v, x(t), cols, g(t), y + t * ldy, ldy, rows);
  if constexpr (T > 1)
    if (t < t1) tiles<T - 1, P, KG, kMin>(v, xb, cols, gsum, y, ldy, rows, t, t1);
}

// Panels [p0, p1) of segment s for every token.
template <int KG, bool kMin>
void segment_panels(const QuantSegment& s, const Call& call, float* y, size_t ldy, size_t p0,
                    size_t p1, Scratch& scratch) {
  const size_t cols = s.cols;
  const float* gsum = kMin ? (KG == 16 ? call.half_sum : call.block_sum) : nullptr;
  const size_t chunk = std::max<size_t>(1, kChunkBytes / (cols * kPanel * sizeof(uint16_t)));
  const size_t tblock =
      std::max<size_t>(kTokens, kTokenBlockBytes / (cols * sizeof(uint16_t)) / kTokens * kTokens);
  for (size_t c0 = p0; c0 < p1; c0 += chunk) {
    const size_t c1 = std::min(p1, c0 + chunk);
    scratch.unpack(s, c0, c1 - c0);
    for (size_t t0 = 0; t0 < call.n; t0 += tblock) {
      const size_t t1 = std::min(call.n, t0 + tblock);
      for (size_t p = c0; p < c1;) {
        // kPanels panels at a time; an odd last one alone.
        const size_t np = p + kPanels <= c1 ? kPanels : 1;
        PanelView v[kPanels];
        for (size_t k = 0; k < np; ++k) v[k] = scratch.panel(p + k - c0);
        const size_t r0 = p * kPanel, rows = std::min(np * kPanel, s.rows - r0);
        if (np == kPanels)
          tiles<kTokens, kPanels, KG, kMin>(v, call.xb, cols, gsum, y + r0, ldy, rows, t0, t1);
        else
          tiles<kTokens, 1, KG, kMin>(v, call.xb, cols, gsum, y + r0, ldy, rows, t0, t1);
        p += np;
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
