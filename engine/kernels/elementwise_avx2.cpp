// Element-wise kernels for AVX2+FMA: rmsnorm, rope, activations, add. Each
// handles any length: 8 lanes at a time, then a masked or scalar tail.
#include <cmath>

#include "kernels/avx2.h"
#include "kernels/vec_avx2.h"

namespace edgellm::kernels::avx2 {

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y) {
  // Sum of squares in double, like the reference: for dim in the thousands it
  // keeps the result independent of summation order, and the cost is nothing
  // next to the matmul that follows.
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  double ss = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
  // y = (x * inv) * w in that order, as the reference rounds it.
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
  }
  for (; i < dim; ++i) y[i] = x[i] * inv * weight[i];
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin) {
  const size_t half = rotary_dim / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* a = x + h * head_dim;
    float* b = a + half;
    size_t i = 0;
    for (; i + 8 <= half; i += 8) {
      const __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
      const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
      // a*c - b*s and b*c + a*s; fms/fma round once where the reference
      // rounds twice, well inside the tests' 1e-6 relative.
      _mm256_storeu_ps(a + i, _mm256_fmsub_ps(va, c, _mm256_mul_ps(vb, s)));
      _mm256_storeu_ps(b + i, _mm256_fmadd_ps(vb, c, _mm256_mul_ps(va, s)));
    }
    for (; i < half; ++i) {
      const float va = a[i], vb = b[i];
      a[i] = va * cos[i] - vb * sin[i];
      b[i] = vb * cos[i] + va * sin[i];
    }
  }
}

namespace {

inline __m256 silu_mul8(__m256 g, __m256 u) {
  // g / (1 + exp(-g)) * u; exp overflowing to inf for g < -88 gives -0, as std::exp does.
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

inline __m256 gelu_tanh_mul8(__m256 g, __m256 u) {
  // 0.5 g (1 + tanh(z)) == g / (1 + exp(-2z)): the same function without the
  // cancellation 1 + tanh(z) suffers for z << 0, and one exp instead of a tanh.
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                 _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  const __m256 e = exp_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), z));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// Applies f to 8 lanes at a time; the tail goes through the same vector code
// on a masked load so every element sees identical arithmetic.
template <typename F>
inline void binary_map(const float* a, const float* b, size_t n, float* out, F f) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    const __m256i m = lane_mask(n - i);
    _mm256_maskstore_ps(out + i, m, f(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
  }
}

template <typename F>
inline void unary_map(const float* a, size_t n, float* out, F f) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i)));
  if (i < n) {
    const __m256i m = lane_mask(n - i);
    _mm256_maskstore_ps(out + i, m, f(_mm256_maskload_ps(a + i, m)));
  }
}

}  // namespace

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  binary_map(gate, up, n, out, [](__m256 g, __m256 u) { return silu_mul8(g, u); });
}

void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out) {
  binary_map(gate, up, n, out, [](__m256 g, __m256 u) { return gelu_tanh_mul8(g, u); });
}

void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out) {
  const __m256 hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
  const __m256 alpha = _mm256_set1_ps(kSwigluOaiAlpha), one = _mm256_set1_ps(1.0f);
  binary_map(gate, up, n, out, [&](__m256 g, __m256 u) {
    g = _mm256_min_ps(hi, g);  // min/max return their second operand for NaN: NaN stays
    u = _mm256_max_ps(lo, _mm256_min_ps(hi, u));
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(g, alpha)));
    return _mm256_mul_ps(_mm256_add_ps(u, one), _mm256_div_ps(g, _mm256_add_ps(one, e)));
  });
}

void add(float* acc, const float* x, size_t n) {
  binary_map(acc, x, n, acc, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
}

void exp_array(const float* x, size_t n, float* out) {
  unary_map(x, n, out, [](__m256 v) { return exp_ps(v); });
}
void tanh_array(const float* x, size_t n, float* out) {
  unary_map(x, n, out, [](__m256 v) { return tanh_ps(v); });
}

}  // namespace edgellm::kernels::avx2
