// What the SIMD kernels need of c4 segments (kernels/quant.h), built once per
// call or tile: the codebook's 16 bytes every lookup table starts from, and
// MXFP4's E8M0 scale bytes as fp32. Under Fault::c4_codes_as_values the
// codebook is the identity 0..15 instead: the codes multiplied as if they were
// the values, the bug the kernels' tests must catch. Internal linkage, as each
// includer is built for its own ISA (AVX2 at least).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/fault_injection.h"
#include "kernels/quant.h"

namespace edgellm::kernels {
namespace {

inline __m128i c4_codebook_bytes(const int8_t* codebook) {
  if (fault::active() == fault::Fault::c4_codes_as_values)
    return _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook));
}

// e8m0_half (kernels/quant.h) of n bytes into out, 8 at a time: (e - 1) << 23,
// or for e < 2 the subnormal 0x00200000 << e.
inline void e8m0_scales(const uint8_t* e, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e + i)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small)));
  }
  for (; i < n; ++i) out[i] = e8m0_half(e[i]);
}

}  // namespace
}  // namespace edgellm::kernels
