// u4 and u5 blocks (kernels/quant.h: 16 bytes of nibbles, u5 then a uint32 of
// fifth bits) as 32 bytes q in element order, for the AVX2 kernels of both
// activation precisions (quant_simd.h, quant_fp32_avx2.cpp). Internal linkage,
// as each includer is built for its own ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace edgellm::kernels::unpack {
namespace {

// q = 0..15: byte j's low nibble is element j, its high nibble element j + 16.
inline __m256i u4_bytes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// q = 0..31: the u4 bytes, plus 16 where bit j of the uint32 after them is set.
inline __m256i u5_bytes(const uint8_t* p) {
  const __m256i lo = u4_bytes(p);
  int32_t qh;
  std::memcpy(&qh, p + 16, 4);
  // Byte j of the result takes byte j / 8 of qh, then its bit j % 8: all ones
  // where set (cmpeq), kept as 0x10. vpshufb indexes within each 128-bit half;
  // both halves hold the four qh bytes, so the indices are 0,1 low and 2,3 high.
  const __m256i sel = _mm256_shuffle_epi8(
      _mm256_set1_epi32(qh), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                               0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i hi =
      _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit), _mm256_set1_epi8(0x10));
  return _mm256_or_si256(lo, hi);
}

}  // namespace
}  // namespace edgellm::kernels::unpack
