// Scalar reference kernels: the algorithmic ground truth for the optimized
// paths and the fallback on CPUs without a SIMD path. Plain loops, fp32 math.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/kernels.h"

namespace edgellm::kernels::ref {

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y) {
  // The scalar layout is plain row-major bf16.
  for (size_t t = 0; t < n; ++t) {
    for (size_t r = 0; r < w.rows; ++r) {
      const uint16_t* row = w.data.data() + r * w.cols;
      float acc = 0.0f;
      for (size_t c = 0; c < w.cols; ++c) acc += bf16_to_float(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = acc + (w.bias ? w.bias[r] : 0.0f);
    }
  }
}

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y) {
  double ss = 0.0;
  for (size_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
  for (size_t i = 0; i < dim; ++i) y[i] = x[i] * inv * weight[i];
}

void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin) {
  const size_t half = rotary_dim / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float inner = kSqrt2OverPi * (g + 0.044715f * g * g * g);
    out[i] = 0.5f * g * (1.0f + std::tanh(inner)) * up[i];
  }
}

void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g / (1.0f + std::exp(-(g * kSwigluOaiAlpha))));
  }
}

void add(float* acc, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += x[i];
}

namespace {

// A cache element widened to fp32: bf16 is exact in fp32.
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t x) {
  return bf16_to_float(x);
}

template <typename T>
void attention_of(const AttentionArgs& a) {
  const size_t group = a.n_heads / a.n_kv_heads;
  std::vector<float> scores(a.start + a.n);
  for (size_t t = 0; t < a.n; ++t) {
    const size_t pos = a.start + t;
    const size_t first = (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
    for (size_t h = 0; h < a.n_heads; ++h) {
      const float* q = a.q + (t * a.n_heads + h) * a.head_dim;
      const size_t kvh = h / group;
      const T* k = static_cast<const T*>(a.k_cache) + kvh * a.cache_stride * a.head_dim;
      const T* v = static_cast<const T*>(a.v_cache) + kvh * a.cache_stride * a.head_dim;
      float max_score = -INFINITY;
      for (size_t p = first; p <= pos; ++p) {
        float s = 0.0f;
        for (size_t d = 0; d < a.head_dim; ++d) s += q[d] * widen(k[p * a.head_dim + d]);
        s *= a.scale;
        if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
        scores[p] = s;
        max_score = std::max(max_score, s);
      }
      float sum = 0.0f;
      for (size_t p = first; p <= pos; ++p) sum += (scores[p] = std::exp(scores[p] - max_score));
      sum = with_sink(a, h, max_score, sum);
      float* o = a.out + (t * a.n_heads + h) * a.head_dim;
      std::fill(o, o + a.head_dim, 0.0f);
      for (size_t p = first; p <= pos; ++p) {
        const float w = scores[p] / sum;
        for (size_t d = 0; d < a.head_dim; ++d) o[d] += w * widen(v[p * a.head_dim + d]);
      }
    }
  }
}

// Keys [0, keys) of a q8_0 cache as fp32, [n_kv_heads][keys][head_dim]:
// int8 times its block's half scale, exact in fp32.
std::vector<float> dequantize(const void* cache, const uint16_t* scales, const AttentionArgs& a,
                              size_t keys) {
  const size_t hd = a.head_dim;
  std::vector<float> out(a.n_kv_heads * keys * hd);
  for (size_t h = 0; h < a.n_kv_heads; ++h)
    for (size_t i = 0; i < keys * hd; ++i) {
      const size_t e = h * a.cache_stride * hd + i;
      out[h * keys * hd + i] =
          static_cast<float>(static_cast<const int8_t*>(cache)[e]) * f16_to_float(scales[e / 32]);
    }
  return out;
}

}  // namespace

void attention(const AttentionArgs& a) {
  if (a.kv_dtype == KvDtype::q8_0) {
    // Dequantized first (exact), then the arithmetic of an fp32 cache holding those values.
    const size_t keys = a.start + a.n;
    const std::vector<float> k = dequantize(a.k_cache, a.k_scale, a, keys);
    const std::vector<float> v = dequantize(a.v_cache, a.v_scale, a, keys);
    AttentionArgs f = a;
    f.k_cache = k.data();
    f.v_cache = v.data();
    f.kv_dtype = KvDtype::fp32;
    f.cache_stride = keys;
    return attention(f);
  }
  if (a.precision == AttnPrecision::bf16) return attention_bf16(a);
  if (a.kv_dtype == KvDtype::bf16)
    attention_of<uint16_t>(a);
  else
    attention_of<float>(a);
}

void top_k(const float* x, size_t n, size_t k, int32_t* out_indices) {
  k = std::min(k, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  // NaN ranks below every number, so the order stays strict and weak.
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                    [&](int32_t a, int32_t b) {
                      const bool na = std::isnan(x[a]), nb = std::isnan(x[b]);
                      if (na || nb) return nb && (!na || a < b);
                      return x[a] > x[b] || (x[a] == x[b] && a < b);
                    });
  std::copy_n(idx.begin(), k, out_indices);
}

}  // namespace edgellm::kernels::ref
