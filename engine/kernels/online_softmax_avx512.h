// The flash-attention online softmax of the AVX-512 prefill kernel: one row's
// step over a block of 32 scores; the block size and the window's first key
// are shared with the amx kernel (whose softmax runs across rows instead).
// Include ONLY from files compiled with the avx512 flags.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/kernels.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {

inline constexpr size_t kSoftmaxBlock = kAttentionKeyBlock;  // keys per block: two vectors

// The first key a query at `pos` sees (sliding window).
inline size_t first_key(const AttentionArgs& a, size_t pos) {
  return (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
}

// Scores s[0..32) of keys [p0, p0 + 32) for a query at `pos`: scaled,
// soft-capped, masked to the keys the query sees (causal, window), turned
// into exp(score - m) in place with the running max m and sum l updated.
// Masked keys get exactly 0 (also every key when the row sees none of the
// block). Returns alpha = exp(m_old - m_new), the factor the row's output
// accumulated so far must be scaled by (1 when nothing changed).
inline float softmax_block_row(const AttentionArgs& a, size_t pos, size_t p0, float* s, float& m,
                               float& l) {
  const size_t k_lo = std::max(p0, first_key(a, pos)), k_hi = std::min(p0 + kSoftmaxBlock, pos + 1);
  if (k_lo >= k_hi) {
    std::fill(s, s + kSoftmaxBlock, 0.0f);
    return 1.0f;
  }
  const __mmask32 keep = static_cast<__mmask32>(
      ((k_hi - p0 == 32 ? 0xffffffffu : (1u << (k_hi - p0)) - 1u)) & ~((1u << (k_lo - p0)) - 1u));
  __m512 x[2];
  for (int i = 0; i < 2; ++i) {
    x[i] = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * i), _mm512_set1_ps(a.scale));
    if (a.softcap > 0.0f) {
      const __m512 cap = _mm512_set1_ps(a.softcap);
      x[i] = _mm512_mul_ps(cap, tanh_ps(_mm512_div_ps(x[i], cap)));
    }
    const __mmask16 k = static_cast<__mmask16>(keep >> (16 * i));
    x[i] = _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), x[i]);
  }
  const float m_old = m;
  const float m_new = std::max(m_old, _mm512_reduce_max_ps(_mm512_max_ps(x[0], x[1])));
  const float alpha = std::exp(m_old - m_new);  // m_old = -inf on the first block: 0
  const __m512 vm = _mm512_set1_ps(m_new);
  // Masked keys get exactly 0, not exp's smallest denormal.
  const __m512 e0 =
      _mm512_maskz_mov_ps(static_cast<__mmask16>(keep), exp_ps(_mm512_sub_ps(x[0], vm)));
  const __m512 e1 =
      _mm512_maskz_mov_ps(static_cast<__mmask16>(keep >> 16), exp_ps(_mm512_sub_ps(x[1], vm)));
  _mm512_storeu_ps(s, e0);
  _mm512_storeu_ps(s + 16, e1);
  l = l * alpha + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
  m = m_new;
  return alpha;
}

// The attention sinks (AttentionArgs::sinks) of a tile whose softmax runs in log2 units, 16
// rows a vector (the amx and bf16 prefill kernels): row r < rows is head kvh * group + r % group,
// m / l its running max and sum; inv_l[r] becomes 1 / (l + 2^(sink log2 e - m)).
inline void add_sinks_log2(const AttentionArgs& a, size_t group, size_t kvh, size_t rows,
                           const __m512* m, const __m512* l, float* inv_l) {
  constexpr float kLog2e = 1.44269504088896341f;
  alignas(64) float mr[16], lr[16];
  for (size_t r0 = 0; r0 < rows; r0 += 16) {
    _mm512_store_ps(mr, m[r0 / 16]);
    _mm512_store_ps(lr, l[r0 / 16]);
    for (size_t i = 0; i < 16 && r0 + i < rows; ++i) {
      const float sink = a.sinks[kvh * group + (r0 + i) % group];
      inv_l[r0 + i] = 1.0f / (lr[i] + std::exp2(sink * kLog2e - mr[i]));
    }
  }
}

}  // namespace edgellm::kernels::avx512
