// Quantized matmul rows with fp32 activations (kernels/quant.h), written once
// over a vector type V: quant_fp32_avx2.cpp (8 lanes) and quant_fp32_avx512.cpp
// (16 lanes) include it after defining V and QUANT_NS.
//
// A block of 32 weights is unpacked into 32 / V::kLanes fp32 vectors (int to
// float in registers: vpmovzxbd / vpmovsxbd + vcvtdq2ps), multiplied with x
// and scaled once per block (per 16 for Q6_K):
//   acc += scale_b * (q_b . x_b)
// Zero points and mins are taken once per row and token, not per element:
//   y = acc - zero * sum_b scale_b * sum(x_b) + sum_b min_b * sum(x_b).
// Tiles: decode runs 4 rows x 1 token (four independent FMA chains, x loaded
// once for four rows), prefill 2 rows x 4 tokens (a block unpacked once for
// four tokens).
//
// V provides: F (the vector), kLanes, zero(), set1(), load(), mul(), fmadd(),
// hsum(), unpack_u4(block16, F[32 / kLanes]), unpack_i8(block32, F[...]),
// and dot(w, w16, b, n) (sum w[i] * b[i], w fp32 or IEEE half).
#include "kernels/quant.h"

namespace edgellm::kernels::QUANT_NS {

namespace {

constexpr int kVecs = 32 / V::kLanes;  // vectors per block of 32

inline float scale_at(const QuantSegment& s, size_t i) {
  return s.half_scales ? _cvtsh_ss(s.scales16[i]) : s.scales[i];
}

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
#pragma GCC unroll 4
    for (int v = 1; v < kVecs; ++v) d[0] = V::fmadd(w[v], V::load(xb + v * V::kLanes), d[0]);
  }
}

template <bool kU4, bool kG16, int R, int T>
void tile(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r, size_t t0) {
  const size_t nb = s.cols / 32, ng = s.cols / s.group;
  typename V::F acc[R][T];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) acc[i][j] = V::zero();
  for (size_t b = 0; b < nb; ++b) {
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const size_t row = r + i;
      typename V::F w[kVecs];
      if constexpr (kU4)
        V::unpack_u4(s.qs.data() + row * s.row_bytes() + b * 16, w);
      else
        V::unpack_i8(s.qs.data() + row * s.cols + b * 32, w);
      const size_t g = row * ng + (kG16 ? 2 * b : b);
      const typename V::F s0 = V::set1(scale_at(s, g));
      const typename V::F s1 = kG16 ? V::set1(scale_at(s, g + 1)) : s0;
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) {
        typename V::F d[2];
        block_dot<kG16>(w, a.x + (t0 + j) * a.cols + b * 32, d);
        acc[i][j] = V::fmadd(d[0], s0, acc[i][j]);
        if constexpr (kG16) acc[i][j] = V::fmadd(d[1], s1, acc[i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const size_t row = r + i, t = t0 + j, g0 = row * nb;
      const float* xs = a.block_sum + t * nb;
      float out = V::hsum(acc[i][j]);
      if (kU4 && s.zero)
        out -= static_cast<float>(s.zero) * V::dot(s.half_scales ? nullptr : s.scales.data() + g0,
                                                   s.half_scales ? s.scales16.data() + g0 : nullptr,
                                                   xs, nb);
      if (kU4 && s.has_min)
        out += V::dot(s.half_scales ? nullptr : s.mins.data() + g0,
                      s.half_scales ? s.mins16.data() + g0 : nullptr, xs, nb);
      y[t * ldy + row] = out;
    }
}

template <bool kU4, bool kG16>
void rows(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0, size_t r1) {
  if (a.n == 1) {
    size_t r = r0;
    for (; r + 4 <= r1; r += 4) tile<kU4, kG16, 4, 1>(s, a, y, ldy, r, 0);
    for (; r < r1; ++r) tile<kU4, kG16, 1, 1>(s, a, y, ldy, r, 0);
    return;
  }
  size_t r = r0;
  for (; r + 2 <= r1; r += 2) {
    size_t t = 0;
    for (; t + 4 <= a.n; t += 4) tile<kU4, kG16, 2, 4>(s, a, y, ldy, r, t);
    for (; t < a.n; ++t) tile<kU4, kG16, 2, 1>(s, a, y, ldy, r, t);
  }
  for (; r < r1; ++r) {
    size_t t = 0;
    for (; t + 4 <= a.n; t += 4) tile<kU4, kG16, 1, 4>(s, a, y, ldy, r, t);
    for (; t < a.n; ++t) tile<kU4, kG16, 1, 1>(s, a, y, ldy, r, t);
  }
}

}  // namespace

void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1) {
  if (s.layout == QuantLayout::u4)
    rows<true, false>(s, a, y, ldy, r0, r1);
  else if (s.group == 16)
    rows<false, true>(s, a, y, ldy, r0, r1);
  else
    rows<false, false>(s, a, y, ldy, r0, r1);
}

}  // namespace edgellm::kernels::QUANT_NS
