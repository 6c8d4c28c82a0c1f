// Element-wise kernels for AVX-512: rmsnorm, rope, activations, add. The same
// arithmetic as elementwise_avx2.cpp, 16 lanes at a time; a tail goes through
// the same vector code under a lane mask, so every element sees one formula.
#include <immintrin.h>

#include <cmath>

#include "kernels/avx512.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

inline __mmask16 tail_mask(size_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

template <typename F>
inline void binary_map(const float* a, const float* b, size_t n, float* out, F f) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, f(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m,
                          f(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

inline __m512 silu_mul16(__m512 g, __m512 u) {
  // g / (1 + exp(-g)) * u; exp overflowing to inf for g < -88 gives -0, as std::exp does.
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

inline __m512 gelu_tanh_mul16(__m512 g, __m512 u) {
  // 0.5 g (1 + tanh(z)) == g / (1 + exp(-2z)), as in elementwise_avx2.cpp.
  const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
  const __m512 z = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                 _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
  const __m512 e = exp_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f), z));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y) {
  // Sum of squares in double, like the reference (order-independent enough at
  // any dim); the masked tail adds zeros.
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (size_t i = 0; i < dim; i += 16) {
    const __mmask16 m = dim - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(dim - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
  // y = (x * inv) * w in that order, as the reference rounds it.
  const __m512 vinv = _mm512_set1_ps(inv);
  for (size_t i = 0; i < dim; i += 16) {
    const __mmask16 m = dim - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(dim - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vinv);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin) {
  const size_t half = rotary_dim / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* a = x + h * head_dim;
    float* b = a + half;
    for (size_t i = 0; i < half; i += 16) {
      const __mmask16 m = half - i >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(half - i);
      const __m512 va = _mm512_maskz_loadu_ps(m, a + i), vb = _mm512_maskz_loadu_ps(m, b + i);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i), s = _mm512_maskz_loadu_ps(m, sin + i);
      // a*c - b*s and b*c + a*s, one rounding fewer than the reference, as avx2.
      _mm512_mask_storeu_ps(a + i, m, _mm512_fmsub_ps(va, c, _mm512_mul_ps(vb, s)));
      _mm512_mask_storeu_ps(b + i, m, _mm512_fmadd_ps(vb, c, _mm512_mul_ps(va, s)));
    }
  }
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  binary_map(gate, up, n, out, [](__m512 g, __m512 u) { return silu_mul16(g, u); });
}

void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out) {
  binary_map(gate, up, n, out, [](__m512 g, __m512 u) { return gelu_tanh_mul16(g, u); });
}

void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out) {
  const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit);
  const __m512 alpha = _mm512_set1_ps(kSwigluOaiAlpha), one = _mm512_set1_ps(1.0f);
  binary_map(gate, up, n, out, [&](__m512 g, __m512 u) {
    g = _mm512_min_ps(hi, g);  // min/max return their second operand for NaN: NaN stays
    u = _mm512_max_ps(lo, _mm512_min_ps(hi, u));
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(g, alpha)));
    return _mm512_mul_ps(_mm512_add_ps(u, one), _mm512_div_ps(g, _mm512_add_ps(one, e)));
  });
}

void add(float* acc, const float* x, size_t n) {
  binary_map(acc, x, n, acc, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

}  // namespace edgellm::kernels::avx512
