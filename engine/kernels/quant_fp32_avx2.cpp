// Quantized matmul rows with fp32 activations, AVX2 + FMA + F16C (8 lanes):
// see quant_fp32_simd.h.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/quant_c4.h"
#include "kernels/quant_unpack_avx2.h"

namespace edgellm::kernels::avx2 {
namespace {

struct V {
  using F = __m256;
  static constexpr int kPrefillRows = 1, kPrefillTokens = 8;  // fits the register file
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // The sums of four vectors at once: three hadds, then the halves added.
  static void hsum4(const F* v, float* out) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
  static __m256i widen_u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // 16 bytes: low nibbles are elements 0..15, high nibbles 16..31.
  static void unpack_u4(const uint8_t* p, F* w) {
    const __m256i a = widen_u8(p), b = widen_u8(p + 8), m = _mm256_set1_epi32(0x0f);
    w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, m));
    w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, m));
    w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
  // 20 bytes: the 32 values 0..31 as bytes, then widened 8 at a time.
  static void unpack_u5(const uint8_t* p, F* w) {
    const __m256i q = unpack::u5_bytes(p);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
  }
  // c4: the codes as bytes in element order, one vpshufb of the 16-byte
  // codebook (in both 128-bit halves) to int8 values, widened 8 at a time.
  using Table = __m256i;
  static Table code_table(const int8_t* codebook) {
    return _mm256_broadcastsi128_si256(c4_codebook_bytes(codebook));
  }
  static void unpack_c4(const uint8_t* p, Table table, F* w) {
    const __m256i q = _mm256_shuffle_epi8(table, unpack::u4_bytes(p));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  }
  static void unpack_i8(const uint8_t* p, F* w) {
    for (int v = 0; v < 4; ++v)
      w[v] = _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * v))));
  }
  // Lane-wise partial sums of sum_i w[i] * b[i] over n values (w fp32 or
  // IEEE half); the tail from zero-padded copies, so nothing past n is read.
  static F dot_lanes(const float* w, const uint16_t* w16, const float* b, size_t n) {
    F acc = zero();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const F wv = w16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w16 + i)))
                       : _mm256_loadu_ps(w + i);
      acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(b + i), acc);
    }
    if (i < n) {
      alignas(32) float wt[8] = {}, bt[8] = {};
      for (size_t k = i; k < n; ++k) {
        wt[k - i] = w16 ? _cvtsh_ss(w16[k]) : w[k];
        bt[k - i] = b[k];
      }
      acc = _mm256_fmadd_ps(_mm256_load_ps(wt), _mm256_load_ps(bt), acc);
    }
    return acc;
  }
};

}  // namespace
}  // namespace edgellm::kernels::avx2

#define QUANT_NS avx2
#include "kernels/quant_fp32_simd.h"
