// Quantized matmul rows with fp32 activations, AVX-512 (16 lanes): see
// quant_fp32_simd.h.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/quant_c4.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {
namespace {

struct V {
  using F = __m512;
  static constexpr int kPrefillRows = 2, kPrefillTokens = 8;  // fits the register file
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  // The sums of four vectors at once: halves added, then three hadds.
  static void hsum4(const F* v, float* out) {
    __m256 h[4];
    for (int i = 0; i < 4; ++i)
      h[i] = _mm256_add_ps(_mm512_castps512_ps256(v[i]), _mm512_extractf32x8_ps(v[i], 1));
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
  // 16 bytes: low nibbles are elements 0..15, high nibbles 16..31. vpermps
  // reads only an index's low 4 bits, so a 16-entry table 0.0f .. 15.0f turns
  // each nibble into its float in one shuffle (no mask, no convert).
  static void unpack_u4(const uint8_t* p, F* w) {
    const __m512 table = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    w[0] = _mm512_permutexvar_ps(v, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  }
  // 20 bytes: the u4 block, then bit j of a little-endian uint32 adds 16 to
  // element j (exact: small integers). Its two 16-bit halves are the two
  // vectors' lane masks as they stand, each loaded straight into a mask
  // register (kmovw from memory; shifting one 32-bit load cost 3 more
  // instructions per block).
  static void unpack_u5(const uint8_t* p, F* w) {
    unpack_u4(p, w);
    uint16_t lo, hi;
    std::memcpy(&lo, p + 16, 2);
    std::memcpy(&hi, p + 18, 2);
    const __m512 sixteen = _mm512_set1_ps(16.0f);
    w[0] = _mm512_mask_add_ps(w[0], lo, w[0], sixteen);
    w[1] = _mm512_mask_add_ps(w[1], hi, w[1], sixteen);
  }
  // c4: the same one-shuffle lookup, the table holding the codebook's 16 values
  // as floats (exact: int8).
  using Table = __m512;
  static Table code_table(const int8_t* codebook) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c4_codebook_bytes(codebook)));
  }
  static void unpack_c4(const uint8_t* p, Table table, F* w) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    w[0] = _mm512_permutexvar_ps(v, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  }
  static void unpack_i8(const uint8_t* p, F* w) {
    for (int v = 0; v < 2; ++v)
      w[v] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * v))));
  }
  static F dot_lanes(const float* w, const uint16_t* w16, const float* b, size_t n) {
    return avx512::dot_lanes(w, w16, b, n);
  }
};

}  // namespace
}  // namespace edgellm::kernels::avx512

#define QUANT_NS avx512
#include "kernels/quant_fp32_simd.h"
