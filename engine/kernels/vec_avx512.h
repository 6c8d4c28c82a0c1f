// Inline AVX-512 vector math for the *_avx512.cpp kernel files. Include ONLY
// from files compiled with the avx512 flags. The schemes and constants are
// those of vec_avx2.h (Cephes expf / tanhf, ~2 ulp), 16 lanes wide; kept in
// namespace avx512 so the linker never merges them with the AVX2 versions.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace edgellm::kernels::avx512 {

// 32 fp32 (x0: the first 16) as 32 bf16 in order: nearest even, as torch's
// .to(bfloat16); truncated (the top 16 bits) under Fault::bf16_truncate.
inline __m512i to_bf16(__m512 x0, __m512 x1, bool truncate) {
  if (truncate) {
    const __m256i lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x0), 16));
    const __m256i hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x1), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  return (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
}

// Lane-wise partial sums of sum_i w[i] * b[i] over n values (w fp32, or IEEE
// half when w16 is set); the tail through masked loads, which never touch the
// masked-off elements. (The quantized kernels' zero-point and min terms.)
inline __m512 dot_lanes(const float* w, const uint16_t* w16, const float* b, size_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 wv = w16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w16 + i))
                          : _mm512_maskz_loadu_ps(m, w + i);
    acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return acc;
}

// exp(x): x = n ln2 + r, exp(r) by a degree-6 polynomial, times 2^n by
// vscalefps (one rounding, as vec_avx2.h's two exact factors give), so
// denormal results and +inf come out right. NaN passes.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  // y * 2^n in one rounding, denormal results included.
  return _mm512_scalef_ps(y, n);
}

// 2^x, |relative error| ~1e-7 (Cephes exp2f's polynomial on the reduced
// argument, scaled by vscalefps); x < -150 gives 0, x = -inf gives NaN (see
// exp2_ps), for callers that mask those lanes anyway.
inline __m512 exp2_ps_finite(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);  // exact, |r| <= 1/2
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931472028550421e-1f));
  return _mm512_scalef_ps(_mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f)), n);
}

// 2^x as exp2_ps_finite, and x = -inf gives 0.
inline __m512 exp2_ps(__m512 x) {
  return exp2_ps_finite(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)));
}

// tanh(x): odd polynomial below |x| = 0.625, else 1 - 2 / (exp(2|x|) + 1).
inline __m512 tanh_ps(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp_ps(_mm512_add_ps(ax, ax));
  const __m512 big_abs =
      _mm512_sub_ps(_mm512_set1_ps(1.0f),
                    _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  // Sign of x onto |big|: copy bit 31.
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big_abs), sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big,
                              small);
}

}  // namespace edgellm::kernels::avx512
