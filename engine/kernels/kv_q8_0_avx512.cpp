// A q8_0 KV cache's rows widened to fp32 for the AVX-512 attention kernels
// (prefill, decode, amx): int8 times its block's half scale, exact in fp32,
// so a kernel on the widened rows computes what it computes on an fp32
// cache holding those values.
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

// One block of 32 int8 times its scale into out[0, 32).
inline void widen_block(const int8_t* q, float scale, float* out) {
  const __m512 sv = _mm512_set1_ps(scale);
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), sv));
  _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), sv));
}

}  // namespace

void dequantize_q8_0(const int8_t* q, const uint16_t* scales, size_t rows, size_t hd, float* out,
                     size_t out_stride, const Q8Dequant& opt) {
  const size_t nb = hd / kKvQ8Block, blocks = rows * nb;  // rows' blocks are contiguous
  const char* q_bytes = reinterpret_cast<const char*>(q);
  const char* s_bytes = reinterpret_cast<const char*>(scales);
  for (size_t f0 = 0; f0 < blocks; f0 += 16) {
    const size_t chunk = std::min<size_t>(16, blocks - f0);
    alignas(64) float s[16];
    if (opt.neighbour_scale) {
      // Fault: a block takes its neighbour's scale in the same row.
      for (size_t u = 0; u < chunk; ++u) {
        const size_t f = f0 + u, b = f % nb;
        const size_t nbr = nb < 2 ? b : (b ^ 1) < nb ? b ^ 1 : b - 1;
        s[u] = _cvtsh_ss(scales[f - b + nbr]);
      }
    } else {
      const __mmask16 m = static_cast<__mmask16>((1u << chunk) - 1);
      _mm512_store_ps(s, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scales + f0)));
    }
    if (opt.prefetch_ahead) {
      // The lines kPrefetchAhead past this chunk's 512 bytes of int8 and its scales.
      for (size_t b = 0; b < chunk * kKvQ8Block; b += 64)
        _mm_prefetch(q_bytes + f0 * kKvQ8Block + b + opt.prefetch_ahead, _MM_HINT_T1);
      // The scales are 1/16 of the int8 bytes: the same keys ahead is 1/16 the distance.
      if (f0 % 32 == 0) _mm_prefetch(s_bytes + f0 * 2 + opt.prefetch_ahead / 16, _MM_HINT_T1);
    }
    const int8_t* qb = q + f0 * kKvQ8Block;
    if (out_stride == hd) {  // contiguous rows: block f at out + 32 f
      float* o = out + f0 * kKvQ8Block;
      for (size_t u = 0; u < chunk; ++u) widen_block(qb + u * kKvQ8Block, s[u], o + u * kKvQ8Block);
    } else {
      size_t r = f0 / nb, b = f0 % nb;  // the chunk's first block: row r, block b
      for (size_t u = 0; u < chunk; ++u) {
        widen_block(qb + u * kKvQ8Block, s[u], out + r * out_stride + b * kKvQ8Block);
        if (++b == nb) b = 0, ++r;
      }
    }
  }
}

}  // namespace edgellm::kernels::avx512
