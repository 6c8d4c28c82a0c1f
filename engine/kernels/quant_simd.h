// Quantized matmul rows for AVX2 (kernels/quant.h), integer dot products on
// u8 x s8 pairs. Included by quant_avx2.cpp (maddubs -> s16 pairs, madd ->
// s32: any AVX2 CPU) and quant_avxvnni.cpp (one vpdpbusd instead), each
// compiled for its ISA; QUANT_NS names the namespace, QUANT_VNNI picks the dot.
//
// A tile is R rows x T tokens: decode (one token) runs 4 rows at a time so
// four independent accumulator chains hide the FMA latency and each block of
// x is loaded once for four rows; prefill runs 1 row x 4 tokens so a block of
// weights is unpacked once for four tokens. i8 weights use the sign trick
// (|w| as u8, sign(x, w) as s8); activations are in [-127, 127], so neither the
// negation nor the s16 pair sums (<= 2 * 128 * 127) overflow.
#include <immintrin.h>

#include "kernels/quant.h"
#include "kernels/quant_c4.h"
#include "kernels/quant_unpack_avx2.h"

namespace edgellm::kernels::QUANT_NS {

namespace {

// Sums of 4 adjacent u8 x s8 products as 8 fp32 lanes (lane k: elements 4k..4k+3).
inline __m256 dot_lanes(__m256i u, __m256i s) {
#if QUANT_VNNI
  return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s));
#else
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sum_i w[i] * b[i] over n values; w is fp32 or IEEE half (F16C converts).
inline float dot(const float* w, const uint16_t* w16, const float* b, size_t n) {
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wv =
        w16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w16 + i)))
            : _mm256_loadu_ps(w + i);
    acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(b + i), acc);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) sum += (w16 ? _cvtsh_ss(w16[i]) : w[i]) * b[i];
  return sum;
}

// Scale or min i of a segment, whichever way it is stored.
inline float load_scale(const QuantSegment& s, size_t i) {
  return s.e8m0_scales   ? e8m0_half(s.scales8[i])
         : s.half_scales ? _cvtsh_ss(s.scales16[i])
                         : s.scales[i];
}
inline float load_min(const QuantSegment& s, size_t i) {
  return s.half_scales ? _cvtsh_ss(s.mins16[i]) : s.mins[i];
}

// Accumulators of an R-row x T-token tile: 8 fp32 lanes each, plus scalar
// terms (zero points, mins) added once at the end.
template <int R, int T>
struct Tile {
  __m256 acc[R][T];
  float extra[R][T] = {};
  Tile() {
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  void store(float* y, size_t ldy, size_t r, size_t t0) const {
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) y[(t0 + j) * ldy + r + i] = hsum(acc[i][j]) + extra[i][j];
  }
};

// Block b of the quantized activations of tokens t0 .. t0 + T - 1.
template <int T>
inline void load_acts(const QuantizedActs& a, size_t t0, size_t b, __m256i* xq) {
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j)
    xq[j] = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(a.q.data() + (t0 + j) * a.cols + b * 32));
}

// u4 and u5 weights: unsigned q (0..15 / 0..31) times s8 activations, the zero
// point taken out once per row and token.
template <QuantLayout kL, int R, int T>
void tile_unsigned(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r,
                   size_t t0) {
  constexpr size_t kBlock = layout_block_bytes(kL);
  const size_t nb = s.cols / 32;
  Tile<R, T> tile;
  for (size_t b = 0; b < nb; ++b) {
    __m256i xq[T];
    load_acts<T>(a, t0, b, xq);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const size_t row = r + i;
      const uint8_t* blk = s.qs.data() + row * (nb * kBlock) + b * kBlock;
      const __m256i w = kL == QuantLayout::u5 ? unpack::u5_bytes(blk) : unpack::u4_bytes(blk);
      const float ws = load_scale(s, row * nb + b);
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) {
        const float ds = ws * a.scale[(t0 + j) * nb + b];
        tile.acc[i][j] = _mm256_fmadd_ps(dot_lanes(w, xq[j]), _mm256_set1_ps(ds), tile.acc[i][j]);
      }
    }
  }
  // Zero points and mins, once per row and token rather than per block:
  // -zero * sum_b scale_b * (sx_b * qsum_b) + sum_b min_b * sum(x_b).
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const size_t row = r + i, t = t0 + j;
      const size_t g0 = row * nb;
      if (s.zero)
        tile.extra[i][j] -=
            static_cast<float>(s.zero) * dot(s.half_scales ? nullptr : s.scales.data() + g0,
                                             s.half_scales ? s.scales16.data() + g0 : nullptr,
                                             a.scaled_qsum.data() + t * nb, nb);
      if (s.has_min)
        tile.extra[i][j] +=
            dot(s.half_scales ? nullptr : s.mins.data() + g0,
                s.half_scales ? s.mins16.data() + g0 : nullptr, a.sum.data() + t * nb, nb);
    }
  tile.store(y, ldy, r, t0);
}

// i8 weights, and c4 ones looked up into int8 (one vpshufb of the codebook).
template <QuantLayout kL, int R, int T>
void tile_i8(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r,
             size_t t0) {
  const size_t nb = s.cols / 32, ng = s.cols / s.group;
  const bool g16 = s.group == 16;
  [[maybe_unused]] __m256i table{};
  if constexpr (kL == QuantLayout::c4)
    table = _mm256_broadcastsi128_si256(c4_codebook_bytes(s.codebook.data()));
  Tile<R, T> tile;
  for (size_t b = 0; b < nb; ++b) {
    __m256i xq[T];
    load_acts<T>(a, t0, b, xq);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const size_t row = r + i;
      __m256i w;
      if constexpr (kL == QuantLayout::c4)
        w = _mm256_shuffle_epi8(table, unpack::u4_bytes(s.qs.data() + row * nb * 16 + b * 16));
      else
        w = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(s.qs.data() + row * s.cols + b * 32));
      const __m256i aw = _mm256_abs_epi8(w);
      const size_t g0 = row * ng;
      // Lanes 0..3 hold elements 0..15, lanes 4..7 elements 16..31.
      const __m256 ws = g16 ? _mm256_set_m128(_mm_set1_ps(load_scale(s, g0 + 2 * b + 1)),
                                              _mm_set1_ps(load_scale(s, g0 + 2 * b)))
                            : _mm256_set1_ps(load_scale(s, g0 + b));
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) {
        const __m256 ds = _mm256_mul_ps(ws, _mm256_set1_ps(a.scale[(t0 + j) * nb + b]));
        tile.acc[i][j] =
            _mm256_fmadd_ps(dot_lanes(aw, _mm256_sign_epi8(xq[j], w)), ds, tile.acc[i][j]);
      }
    }
  }
  // Mins (Q5_1, Q5_K, Q2_K), once per row and token: sum_g min_g * sum(x_g).
  if (s.has_min)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) {
        const size_t m0 = (r + i) * ng, t = t0 + j;
        tile.extra[i][j] += dot(s.half_scales ? nullptr : s.mins.data() + m0,
                                s.half_scales ? s.mins16.data() + m0 : nullptr,
                                g16 ? a.half_sum.data() + t * ng : a.sum.data() + t * nb, ng);
      }
  tile.store(y, ldy, r, t0);
}

template <int R, int T>
void run_tile(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r,
              size_t t0) {
  if (s.layout == QuantLayout::u4)
    tile_unsigned<QuantLayout::u4, R, T>(s, a, y, ldy, r, t0);
  else if (s.layout == QuantLayout::u5)
    tile_unsigned<QuantLayout::u5, R, T>(s, a, y, ldy, r, t0);
  else if (s.layout == QuantLayout::c4)
    tile_i8<QuantLayout::c4, R, T>(s, a, y, ldy, r, t0);
  else
    tile_i8<QuantLayout::i8, R, T>(s, a, y, ldy, r, t0);
}

}  // namespace

void quant_rows(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r0,
                size_t r1) {
  if (a.n == 1) {
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) run_tile<4, 1>(s, a, y, ldy, r, 0);
    for (; r < r1; ++r) run_tile<1, 1>(s, a, y, ldy, r, 0);
    return;
  }
  for (size_t r = r0; r < r1; ++r) {
    size_t t = 0;
    for (; t + 4 <= a.n; t += 4) run_tile<1, 4>(s, a, y, ldy, r, t);
    for (; t < a.n; ++t) run_tile<1, 1>(s, a, y, ldy, r, t);
  }
}

}  // namespace edgellm::kernels::QUANT_NS
