// 16 x 16 transposes of 32-bit elements in AVX-512 registers, for the
// avx512/amx kernel files. Include ONLY from files compiled with the avx512
// flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace edgellm::kernels::avx512 {

// 16 x 16 dwords: r[i] lane j becomes r[j] lane i.
inline void transpose16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // u[4G + c], 128-bit lane L: column 4L + c of rows 4G .. 4G + 3.
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i p1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i q0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i q1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(p0, q0, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xdd);
  }
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for a 16 x 16 block.
inline void transpose16(const uint32_t* src, size_t src_stride, uint32_t* dst, size_t dst_stride) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_stride);
  transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * dst_stride, r[i]);
}

}  // namespace edgellm::kernels::avx512
