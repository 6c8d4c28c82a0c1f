// Quantized prefill GEMM on AMX-BF16 tiles (kernels/quant.h):
//   y[t][r] = sum_g scale[r,g] * sum_{j in g} (q[r,j] - zero) x[t,j] + min[r,g] * groupsum[t,g]
//
// The integers (q - zero) are exact in bf16; x goes in P bf16 parts
// (avx512::to_bf16_parts). P = 3 (quant_matmul_fp32) holds fp32 x exactly
// (x = hi + mid + lo), so every product is exact and only the fp32 sums round,
// as in matmul_amx.cpp. P = 1 (quant_matmul_bf16, the fast config) rounds x to
// bf16 once, as the avx512 tier's quant_bf16_avx512.cpp does: one pass. Either
// way the scales and mins are applied in fp32 (AVX-512 FMA), never folded
// into bf16 weights, and the group sums are of x as the tiles see it.
//
// The scale changes every group (32 columns, 16 for Q6_K, Q3_K, Q2_K), so each group's
// 32-token x 32-row block is summed in fresh C tiles (tmm0..3, one K-step of
// TDPBF16PS per part), stored, and FMA'd into an fp32 accumulator block with
// the rows' scales (+ min * the tokens' block sums). Four groups' C tiles go to
// one of two buffer sets, so one set's tile products run while the vector
// units scale the other, each accumulator loaded and stored once per set.
//
// Weights stay quantized in memory: each thread unpacks its 16-row panels of
// (q - zero) into bf16 VNNI pairs (kernels/quant_panels_avx512.h) in its own
// scratch, a chunk of panels at a time, once per call, and sweeps every token
// over the chunk (x parts in token blocks that stay in L2).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/quant.h"
#include "kernels/quant_panels_avx512.h"

namespace edgellm::kernels::amx {

namespace {

using quant_panels::kChunkBytes;
using quant_panels::kPanel;
using quant_panels::PanelView;
using quant_panels::Scratch;
constexpr size_t kTokenBlockBytes = 512 * 1024;  // x parts per token block

// C tiles 0..3 (16 x 16 fp32), A tiles 4..5 (16 tokens x KG bf16), B tiles
// 6..7 (KG / 2 column pairs x 16 rows).
template <int KG>
const TileConfig& group_config() {
  static const TileConfig cfg = [] {
    TileConfig c;
    for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = KG * 2;
    for (int t = 6; t < 8; ++t) c.rows[t] = KG / 2, c.colsb[t] = 64;
    return c;
  }();
  return cfg;
}

constexpr size_t kGroupsPerPass = 4;  // C tiles stored per scaling pass

// For groups h0 .. h0 + count: acc[t][0..32) += c[h][t][0..32) * scale[h]
// (+ groupsum[t][h] * min[h]), two panels, each accumulator loaded and stored
// once for the `count` groups.
template <bool kMin>
inline void scale_into(float* acc, const float* c, const PanelView& p0, const PanelView& p1,
                       size_t h0, size_t count, const float* bsum, size_t bstride, size_t tokens) {
  __m512 sc[kGroupsPerPass][2], mn[kGroupsPerPass][2];
  for (size_t i = 0; i < count; ++i) {
    sc[i][0] = _mm512_loadu_ps(p0.scale + (h0 + i) * kPanel);
    sc[i][1] = _mm512_loadu_ps(p1.scale + (h0 + i) * kPanel);
    if constexpr (kMin) {
      mn[i][0] = _mm512_loadu_ps(p0.min + (h0 + i) * kPanel);
      mn[i][1] = _mm512_loadu_ps(p1.min + (h0 + i) * kPanel);
    }
  }
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t half = 0; half < 2; ++half) {
      const size_t o = t * 32 + half * 16;
      __m512 a = _mm512_load_ps(acc + o);
      for (size_t i = 0; i < count; ++i) {
        a = _mm512_fmadd_ps(_mm512_load_ps(c + i * 32 * 32 + o), sc[i][half], a);
        if constexpr (kMin)
          a = _mm512_fmadd_ps(_mm512_set1_ps(bsum[t * bstride + h0 + i]), mn[i][half], a);
      }
      _mm512_store_ps(acc + o, a);
    }
  }
}

// One 32-token x 32-row block of y over all groups. `a` points at the block's
// first token in part 0 (parts `plane` elements apart, rows `cols` apart);
// bsum at the block's first token's group sums (ng per token).
template <class Tiles, int KG, bool kMin, int P>
void block_32x32(Tiles tiles, const uint16_t* a, size_t cols, size_t plane, const PanelView& p0,
                 const PanelView& p1, const float* bsum, float* y, size_t ldy, size_t tokens,
                 size_t rows) {
  constexpr size_t G = kGroupsPerPass;
  alignas(64) float acc[32 * 32];
  alignas(64) float c[2][G][32 * 32];  // two sets of G groups' tiles: 32 KiB, in L1
  std::memset(acc, 0, sizeof(acc));
  const size_t lda = cols * sizeof(uint16_t), a_lower = 16 * cols, ng = cols / KG;
  for (size_t g0 = 0;; g0 += G) {
    const size_t set = (g0 / G) & 1;
    for (size_t g = g0; g < std::min(ng, g0 + G); ++g) {
      const size_t k = g * KG;
      tile_zero<0>(tiles);
      tile_zero<1>(tiles);
      tile_zero<2>(tiles);
      tile_zero<3>(tiles);
      tile_load<6>(tiles, p0.w + k * kPanel, 64);  // pairs k/2.. of the panel, 64 bytes each
      tile_load<7>(tiles, p1.w + k * kPanel, 64);
#pragma GCC unroll 3
      for (size_t p = 0; p < P; ++p) {
        const uint16_t* ap = a + p * plane + k;
        tile_load<4>(tiles, ap, lda);
        tile_load<5>(tiles, ap + a_lower, lda);
        tile_dpbf16ps<0, 4, 6>(tiles);
        tile_dpbf16ps<1, 4, 7>(tiles);
        tile_dpbf16ps<2, 5, 6>(tiles);
        tile_dpbf16ps<3, 5, 7>(tiles);
      }
      float* cb = c[set][g - g0];
      tile_store<0>(tiles, cb, 32 * sizeof(float));
      tile_store<1>(tiles, cb + 16, 32 * sizeof(float));
      tile_store<2>(tiles, cb + 16 * 32, 32 * sizeof(float));
      tile_store<3>(tiles, cb + 16 * 32 + 16, 32 * sizeof(float));
    }
    if (g0 > 0) {  // the previous set, while this set's tile products run
      const size_t h0 = g0 - G;
      scale_into<kMin>(acc, c[set ^ 1][0], p0, p1, h0, G, bsum, ng, tokens);
    }
    if (g0 + G >= ng) {  // this set is the last: scale it too
      scale_into<kMin>(acc, c[set][0], p0, p1, g0, ng - g0, bsum, ng, tokens);
      break;
    }
  }
  for (size_t t = 0; t < tokens; ++t) std::memcpy(y + t * ldy, acc + t * 32, rows * sizeof(float));
}

struct Call {
  const uint16_t* xb;      // `parts` planes of n_pad x cols bf16
  const float* block_sum;  // [n][cols / 32] where a segment has mins per 32
  const float* half_sum;   // [n][cols / 16] where a segment has mins per 16 (Q2_K)
  size_t n, n_pad, parts;
};

// Panels [p0, p1) of segment s (p0 even) for every token.
template <class Tiles, int KG, bool kMin, int P>
void segment_panels(Tiles tiles, const QuantSegment& s, const Call& call, float* y, size_t ldy,
                    size_t p0, size_t p1, Scratch& scratch) {
  // Every call loads the config of its own group shape (K = 16 for Q6_K, 32 for
  // the rest); the fault keeps the other shape's, as a cached config would.
  constexpr int kOther = KG == 16 ? 32 : 16;
  tile_config(tiles, fault::active() == fault::Fault::stale_tile_config ? &group_config<kOther>()
                                                                        : &group_config<KG>());
  const size_t cols = s.cols, ng = cols / KG, plane = call.n_pad * cols;
  const float* group_sum = KG == 16 ? call.half_sum : call.block_sum;
  const size_t panel_bytes = cols * kPanel * sizeof(uint16_t);
  const size_t chunk = std::max<size_t>(2, kChunkBytes / panel_bytes / 2 * 2);
  const size_t tblock = std::max<size_t>(32, kTokenBlockBytes / (P * cols * 2) / 32 * 32);
  for (size_t c0 = p0; c0 < p1; c0 += chunk) {
    const size_t c1 = std::min(p1, c0 + chunk);
    scratch.unpack(s, c0, (c1 - c0 + 1) / 2 * 2);  // an odd last panel gets a zero partner
    for (size_t t0 = 0; t0 < call.n; t0 += tblock) {
      const size_t t1 = std::min(call.n, t0 + tblock);
      for (size_t p = c0; p < c1; p += 2) {
        const PanelView v0 = scratch.panel(p - c0), v1 = scratch.panel(p - c0 + 1);
        const size_t r0 = p * kPanel, rows = std::min<size_t>(2 * kPanel, s.rows - r0);
        for (size_t t = t0; t < t1; t += 32)
          block_32x32<Tiles, KG, kMin, P>(tiles, call.xb + t * cols, cols, plane, v0, v1,
                                          kMin ? group_sum + t * ng : nullptr, y + t * ldy + r0,
                                          ldy, std::min<size_t>(32, call.n - t), rows);
      }
    }
  }
  tile_release(tiles);
}

void run_segment(const QuantSegment& s, const Call& call, float* y, size_t ldy, size_t p0,
                 size_t p1) {
  thread_local Scratch scratch;
  with_tiles([&](auto tiles) {
    using T = decltype(tiles);
    if (call.parts == 1) {
      const auto run =
          s.group == 16
              ? (s.has_min ? segment_panels<T, 16, true, 1> : segment_panels<T, 16, false, 1>)
              : (s.has_min ? segment_panels<T, 32, true, 1> : segment_panels<T, 32, false, 1>);
      return run(tiles, s, call, y, ldy, p0, p1, scratch);
    }
    const auto run =
        s.group == 16
            ? (s.has_min ? segment_panels<T, 16, true, 3> : segment_panels<T, 16, false, 3>)
            : (s.has_min ? segment_panels<T, 32, true, 3> : segment_panels<T, 32, false, 3>);
    run(tiles, s, call, y, ldy, p0, p1, scratch);
  });
}

}  // namespace

// x in `parts` bf16 parts: 3 (exact) or 1 (x rounded once).
void quant_matmul_parts(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                        size_t parts) {
  const size_t cols = w.cols, n_pad = (n + 31) / 32 * 32, nb = cols / 32;
  uint16_t* xb = avx512::bf16_scratch(parts * n_pad * cols);
  avx512::to_bf16_parts(x, n, cols, n_pad, cols, parts, xb, pool);
  // Block sums only for mins, vectorised and split over the pool: the scalar
  // block_sums() is a serial add chain, ~0.5 ms at 512 x 576 (a fifth of a GEMM).
  thread_local std::vector<float> sums, halves;
  const bool mins = std::any_of(w.segments.begin(), w.segments.end(),
                                [](const QuantSegment& s) { return s.has_min && s.group == 32; });
  // The sums are of x as the tiles see it: with one part, of the rounded x
  // (the plane's first row block), so the min term rounds x as the products do.
  const auto load16 = [&](size_t i) {
    if (parts == 3) return _mm512_loadu_ps(x + i);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  };
  if (mins) {
    sums.resize(n * nb);
    float* out = sums.data();  // this thread's buffer, written by the workers
    pool.parallel_chunks(n, [&](size_t t0, size_t t1) {
      for (size_t i = t0 * nb; i < t1 * nb; ++i)
        out[i] = _mm512_reduce_add_ps(_mm512_add_ps(load16(i * 32), load16(i * 32 + 16)));
    });
  }
  const bool mins16 = std::any_of(w.segments.begin(), w.segments.end(),
                                  [](const QuantSegment& s) { return s.mins_per_16(); });
  if (mins16) {
    halves.resize(n * nb * 2);
    float* out = halves.data();
    pool.parallel_chunks(n, [&](size_t t0, size_t t1) {
      for (size_t i = t0 * nb * 2; i < t1 * nb * 2; ++i)
        out[i] = _mm512_reduce_add_ps(load16(i * 16));
    });
  }
  const Call call{.xb = xb,
                  .block_sum = mins ? sums.data() : nullptr,
                  .half_sum = mins16 ? halves.data() : nullptr,
                  .n = n,
                  .n_pad = n_pad,
                  .parts = parts};
  // Work items: pairs of panels over all segments (32 rows each, the block).
  std::vector<size_t> first_pair;  // per segment, then the total
  size_t pairs = 0;
  for (const QuantSegment& s : w.segments) {
    first_pair.push_back(pairs);
    pairs += (s.rows + 2 * kPanel - 1) / (2 * kPanel);
  }
  pool.parallel_chunks(pairs, [&](size_t q0, size_t q1) {
    size_t base = 0;  // first row of the segment
    for (size_t i = 0; i < w.segments.size(); ++i) {
      const QuantSegment& s = w.segments[i];
      const size_t s_pairs = (s.rows + 2 * kPanel - 1) / (2 * kPanel);
      const size_t lo = std::max(q0, first_pair[i]), hi = std::min(q1, first_pair[i] + s_pairs);
      if (lo < hi)
        run_segment(s, call, y + base, w.rows, 2 * (lo - first_pair[i]),
                    std::min((s.rows + kPanel - 1) / kPanel, 2 * (hi - first_pair[i])));
      base += s.rows;
    }
  });
}

void quant_matmul_fp32(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  quant_matmul_parts(w, x, n, y, pool, 3);
}

void quant_matmul_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  quant_matmul_parts(w, x, n, y, pool, 1);
}

}  // namespace edgellm::kernels::amx
