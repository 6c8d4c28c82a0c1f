// Quantized matmul rows with fp32 activations (kernels/quant.h), written once
// over a vector type V: quant_fp32_avx2.cpp (8 lanes) and quant_fp32_avx512.cpp
// (16 lanes) include it after defining V and QUANT_NS.
//
// A block of 32 weights is unpacked into 32 / V::kLanes fp32 vectors (int to
// float in registers: vpmovzxbd / vpmovsxbd + vcvtdq2ps), multiplied with x
// and scaled once per block (per 16 for Q6_K):
//   acc += scale_b * (q_b . x_b)
// Zero points and mins are taken once per row and token, not per element:
//   y = acc - zero * sum_b scale_b * sum(x_b) + sum_g min_g * sum(x_g)
// (g the min's group: 32, or 16 for Q2_K),
// both sums lane-wise into acc, so each output takes a single reduction.
// Tiles: decode runs 4 rows x 1 token (four independent FMA chains, x loaded
// once for four rows, the four sums reduced together), batched decode
// (per_token) 4 rows x up to 4 tokens with that same arithmetic per token (a
// block unpacked once for the tile's tokens); prefill V::kPrefillRows x
// V::kPrefillTokens (a block unpacked and scaled once for all those tokens,
// then one FMA per vector and token: AVX-512 2 x 8 in 16 accumulators, AVX2
// 1 x 8), and 4 / 2 / 1-token tiles for the tokens left over (small-batch
// decode unpacks each block once for up to 4 tokens).
//
// Decode is bound by one core's memory-level parallelism: on demand misses
// alone a core read ~6 GB/s from DRAM while the same kernel on L2-resident
// weights ran at 11-26 GB/s and a plain read loop at ~11 GB/s
// (bench/quant_gemv_bench.cpp), so every tile prefetches its weights
// kPrefetchBytes ahead (8-10 GB/s per core).
//
// V provides: F (the vector), kLanes, kPrefillRows, kPrefillTokens, zero(), set1(), load(), add(),
// mul(), fmadd(), hsum(), hsum4(F[4], float[4]), unpack_u4(block16, F[32 / kLanes]),
// unpack_u5(block20, F[...]), unpack_i8(block32, F[...]), Table and code_table(int8[16])
// with unpack_c4(block16, Table, F[...]) (a c4 segment's codebook, built once per tile), and
// dot_lanes(w, w16, b, n) (lane-wise sum w[i] * b[i], w fp32 or IEEE half).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/quant.h"
#include "kernels/quant_c4.h"

namespace edgellm::kernels::QUANT_NS {

namespace {

constexpr int kVecs = 32 / V::kLanes;  // vectors per block of 32

// Block b of x (token t) times the unpacked weights: one sum per scale group.
template <bool kG16>
inline void block_dot(const typename V::F* w, const float* xb, typename V::F* d) {
  if constexpr (kG16) {  // lanes of the first 16 elements, then of the second
    constexpr int h = kVecs / 2;
    d[0] = V::mul(w[0], V::load(xb));
    for (int v = 1; v < h; ++v) d[0] = V::fmadd(w[v], V::load(xb + v * V::kLanes), d[0]);
    d[1] = V::mul(w[h], V::load(xb + h * V::kLanes));
    for (int v = h + 1; v < kVecs; ++v) d[1] = V::fmadd(w[v], V::load(xb + v * V::kLanes), d[1]);
  } else {
    d[0] = V::mul(w[0], V::load(xb));
#pragma GCC unroll 8
    for (int v = 1; v < kVecs; ++v) d[0] = V::fmadd(w[v], V::load(xb + v * V::kLanes), d[0]);
  }
}

// Scales of groups [g0, g0 + n) as fp32, so the block loop broadcasts them
// straight from memory instead of converting a half per block.
inline void load_scales(const QuantSegment& s, size_t g0, size_t n, float* out) {
  if (s.e8m0_scales) {
    e8m0_scales(s.scales8.data() + g0, n, out);
    return;
  }
  if (!s.half_scales) {
    std::memcpy(out, s.scales.data() + g0, n * sizeof(float));
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(s.scales16.data() + g0 + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(s.scales16[g0 + i]);
}

constexpr size_t kChunk = 64;  // blocks whose scales are staged at a time
// How far ahead of the tile's weights to prefetch. Measured on the decode GEMV
// (quant_gemv_bench, 2 threads from DRAM): 1 KB gains less, 3 KB and more
// start to lose.
constexpr size_t kPrefetchBytes = 2048;

// kPerToken: every token takes decode's arithmetic (the dot, then the scale)
// whatever T, so that batched decode equals the GEMV bit for bit.
template <QuantLayout kL, bool kG16, int R, int T, bool kPerToken = false>
void tile(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r, size_t t0) {
  using F = typename V::F;
  constexpr int L = V::kLanes;

  const size_t nb = s.cols / 32, ng = s.cols / s.group;
  constexpr size_t kPer = kG16 ? 2 : 1;  // scales per block
  const bool zero = kL != QuantLayout::i8 && s.zero != 0, mins = s.has_min;
  F acc[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) acc[i][j] = V::zero();
  alignas(64) float sc[R][kChunk * kPer];
  constexpr size_t kBlock = layout_block_bytes(kL), kStep = R * kBlock;  // tile bytes per block
  const size_t row_bytes = nb * kBlock;  // s.row_bytes() without its run-time layout switch
  const uint8_t* const tile_ptr = s.qs.data() + r * row_bytes;
  const uintptr_t tile_qs = reinterpret_cast<uintptr_t>(tile_ptr);
  [[maybe_unused]] typename V::Table table{};
  if constexpr (kL == QuantLayout::c4) table = V::code_table(s.codebook.data());
  for (size_t b0 = 0; b0 < nb; b0 += kChunk) {
    const size_t b1 = std::min(nb, b0 + kChunk);
    for (int i = 0; i < R; ++i) load_scales(s, (r + i) * ng + b0 * kPer, (b1 - b0) * kPer, sc[i]);
    for (size_t b = b0; b < b1; ++b) {
      // The bytes this tile reads at block b, kPrefetchBytes ahead (a line each).
      // (An address, not a pointer: past the last tile it points nowhere, and a
      // prefetch never faults.)
      for (size_t k = 0; k < kStep; k += 64)
        _mm_prefetch(reinterpret_cast<const char*>(tile_qs + kPrefetchBytes + b * kStep + k),
                     _MM_HINT_T0);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        F w[kVecs];
        const uint8_t* blk = tile_ptr + i * row_bytes + b * kBlock;
        if constexpr (kL == QuantLayout::u4)
          V::unpack_u4(blk, w);
        else if constexpr (kL == QuantLayout::u5)
          V::unpack_u5(blk, w);
        else if constexpr (kL == QuantLayout::c4)
          V::unpack_c4(blk, table, w);
        else
          V::unpack_i8(blk, w);
        const float* bs = sc[i] + (b - b0) * kPer;
        if constexpr (T > 1 && !kPerToken) {
          // Prefill: scale the block once, then one FMA per vector and token.
#pragma GCC unroll 8
          for (int v = 0; v < kVecs; ++v)
            w[v] = V::mul(w[v], V::set1(bs[kG16 && v >= kVecs / 2 ? 1 : 0]));
#pragma GCC unroll 8
          for (int j = 0; j < T; ++j) {
            const float* xb = a.x + (t0 + j) * a.cols + b * 32;
#pragma GCC unroll 8
            for (int v = 0; v < kVecs; ++v)
              acc[i][j] = V::fmadd(w[v], V::load(xb + v * L), acc[i][j]);
          }
        } else {
          // Decode: the scale once per block (per 16 for Q6_K), after the dot.
#pragma GCC unroll 4
          for (int j = 0; j < T; ++j) {
            F d[2];
            block_dot<kG16>(w, a.x + (t0 + j) * a.cols + b * 32, d);
            acc[i][j] = V::fmadd(d[0], V::set1(bs[0]), acc[i][j]);
            if constexpr (kG16) acc[i][j] = V::fmadd(d[1], V::set1(bs[1]), acc[i][j]);
          }
        }
      }
    }
  }
  // Zero points and mins, lane-wise into acc, so each output takes one reduction.
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) {
      const size_t g0 = (r + i) * nb;
      const float* xsum = a.block_sum + (t0 + j) * nb;
      if (zero)
        acc[i][j] =
            V::fmadd(V::dot_lanes(s.half_scales ? nullptr : s.scales.data() + g0,
                                  s.half_scales ? s.scales16.data() + g0 : nullptr, xsum, nb),
                     V::set1(-static_cast<float>(s.zero)), acc[i][j]);
      if (mins) {  // one min per scale group
        const size_t m0 = (r + i) * ng;
        const float* gsum = kG16 ? a.half_sum + (t0 + j) * ng : xsum;
        acc[i][j] = V::add(acc[i][j],
                           V::dot_lanes(s.half_scales ? nullptr : s.mins.data() + m0,
                                        s.half_scales ? s.mins16.data() + m0 : nullptr, gsum, ng));
      }
    }
  if constexpr (R == 4 && (T == 1 || kPerToken)) {  // decode: four rows reduced together
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const F v[4] = {acc[0][j], acc[1][j], acc[2][j], acc[3][j]};
      alignas(16) float out[4];
      V::hsum4(v, out);
      for (int i = 0; i < 4; ++i) y[(t0 + j) * ldy + r + i] = out[i];
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) y[(t0 + j) * ldy + r + i] = V::hsum(acc[i][j]);
  }
}

// Rows [r, r + R) for tokens [t, n): full T-token tiles, then 4 / 2 / 1.
template <QuantLayout kL, bool kG16, int R>
void row_tiles(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r) {
  constexpr int T = V::kPrefillTokens;
  size_t t = 0;
  for (; t + T <= a.n; t += T) tile<kL, kG16, R, T>(s, a, y, ldy, r, t);
  if constexpr (T > 4)
    for (; t + 4 <= a.n; t += 4) tile<kL, kG16, R, 4>(s, a, y, ldy, r, t);
  for (; t + 2 <= a.n; t += 2) tile<kL, kG16, R, 2>(s, a, y, ldy, r, t);
  for (; t < a.n; ++t) tile<kL, kG16, R, 1>(s, a, y, ldy, r, t);
}

// Batched decode: the GEMV's row tiles (4 rows, then single rows), each for
// up to 4 tokens at a time.
template <QuantLayout kL, bool kG16, int R>
void per_token_tiles(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r) {
  size_t t = 0;
  for (; t + 4 <= a.n; t += 4) tile<kL, kG16, R, 4, true>(s, a, y, ldy, r, t);
  for (; t + 2 <= a.n; t += 2) tile<kL, kG16, R, 2, true>(s, a, y, ldy, r, t);
  for (; t < a.n; ++t) tile<kL, kG16, R, 1, true>(s, a, y, ldy, r, t);
}

template <QuantLayout kL, bool kG16>
void rows(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0, size_t r1) {
  if (a.per_token && a.n > 1) {
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) per_token_tiles<kL, kG16, 4>(s, a, y, ldy, r);
    for (; r < r1; ++r) per_token_tiles<kL, kG16, 1>(s, a, y, ldy, r);
    return;
  }
  if (a.n == 1) {
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) tile<kL, kG16, 4, 1>(s, a, y, ldy, r, 0);
    for (; r < r1; ++r) tile<kL, kG16, 1, 1>(s, a, y, ldy, r, 0);
    return;
  }
  constexpr int R = V::kPrefillRows;
  size_t r = r0;
  for (; r + R <= r1; r += R) row_tiles<kL, kG16, R>(s, a, y, ldy, r);
  for (; r < r1; ++r) row_tiles<kL, kG16, 1>(s, a, y, ldy, r);
}

}  // namespace

void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1) {
  if (s.layout == QuantLayout::u4)
    rows<QuantLayout::u4, false>(s, a, y, ldy, r0, r1);
  else if (s.layout == QuantLayout::u5)
    rows<QuantLayout::u5, false>(s, a, y, ldy, r0, r1);
  else if (s.layout == QuantLayout::c4)
    rows<QuantLayout::c4, false>(s, a, y, ldy, r0, r1);
  else if (s.group == 16)
    rows<QuantLayout::i8, true>(s, a, y, ldy, r0, r1);
  else
    rows<QuantLayout::i8, false>(s, a, y, ldy, r0, r1);
}

}  // namespace edgellm::kernels::QUANT_NS
