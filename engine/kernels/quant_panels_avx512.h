// 16-row panels of quantized weights unpacked to bf16 for a prefill GEMM
// (kernels/quant.h): (q - zero) as bf16 column pairs, the B-tile layout of
// kernels/avx512.h (pair k of the 16 rows in 64 bytes: row n's two values at
// 4n), which is also what VDPBF16PS takes per lane. Small integers are exact in
// bf16; the scales and mins stay fp32, one [group][16 rows] table each, so a
// GEMM applies them per group and never rounds a weight. Shared by the AMX
// (quant_amx.cpp) and the AVX-512 BF16 (quant_bf16_avx512.cpp) GEMMs; internal
// linkage, as each includer is built for its own ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/quant.h"
#include "kernels/quant_c4.h"
#include "kernels/transpose_avx512.h"

namespace edgellm::kernels::quant_panels {
namespace {

constexpr size_t kPanel = 16;                // rows of a panel (a B tile's N, a zmm's lanes)
constexpr size_t kChunkBytes = 1024 * 1024;  // unpacked panels per chunk

// Block b (32 columns) of row r as 32 bf16 (q - zero; c4 codebook[q]), element order: as
// dwords, the 16 column pairs of the VNNI layout. Small integers are exact.
inline __m512i unpack_block(const QuantSegment& s, size_t r, size_t b) {
  __m512i lo, hi;
  if (s.layout == QuantLayout::i8) {
    const uint8_t* p = s.qs.data() + r * s.cols + b * 32;
    lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  } else {  // byte j: element j (low nibble), element j + 16 (high nibble)
    const uint8_t* p = s.qs.data() + r * s.row_bytes() + b * layout_block_bytes(s.layout);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_and_si512(v, _mm512_set1_epi32(0xf));
    hi = _mm512_srli_epi32(v, 4);
    if (s.layout == QuantLayout::u5) {  // u5: bit j of the uint32 after the nibbles adds 16
      uint32_t qh;
      std::memcpy(&qh, p + 16, 4);
      const __m512i sixteen = _mm512_set1_epi32(16);
      lo = _mm512_mask_or_epi32(lo, static_cast<__mmask16>(qh), lo, sixteen);
      hi = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
    }
    if (s.layout == QuantLayout::c4) {  // codebook[q]: vpermd reads an index's low 4 bits
      const __m512i table = _mm512_cvtepi8_epi32(c4_codebook_bytes(s.codebook.data()));
      lo = _mm512_permutexvar_epi32(lo, table);
      hi = _mm512_permutexvar_epi32(hi, table);
    }
    const __m512i zero = _mm512_set1_epi32(s.zero);
    lo = _mm512_sub_epi32(lo, zero);
    hi = _mm512_sub_epi32(hi, zero);
  }
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(hi), _mm512_cvtepi32_ps(lo));
}

// Values [i0, i0 + count) of fp32 `f` or IEEE-half `h` (when not null) to
// out[0], out[kPanel], ...: one row's scales as a panel column (zeros past the
// segment). Inline: QuantSegment::scale() per value was a call per scale.
inline void column(const float* f, const uint16_t* h, size_t i0, size_t count, bool have,
                   float* out) {
  for (size_t g = 0; g < count; ++g)
    out[g * kPanel] = !have ? 0.0f : h ? _cvtsh_ss(h[i0 + g]) : f[i0 + g];
}

// A panel's unpacked weights, scales [group][16] and mins [group][16].
struct PanelView {
  const uint16_t* w;
  const float* scale;
  const float* min;
};

// Per-thread scratch: `count` panels of segment s from panel p0 (missing rows
// are zeros with zero scales).
struct Scratch {
  std::vector<uint16_t> w;
  std::vector<float> scale, min;
  size_t wstride = 0, sstride = 0, mstride = 0;

  void unpack(const QuantSegment& s, size_t p0, size_t count) {
    const size_t nb = s.cols / 32, ng = s.cols / s.group;
    wstride = s.cols * kPanel;
    sstride = ng * kPanel;
    mstride = s.has_min ? ng * kPanel : 0;
    w.resize(count * wstride + 32);
    scale.resize(count * sstride);
    min.resize(count * mstride);
    for (size_t i = 0; i < count; ++i) {
      const size_t r0 = (p0 + i) * kPanel;
      uint16_t* dst = wdata() + i * wstride;
      for (size_t b = 0; b < nb; ++b) {
        __m512i rows[16];
        for (size_t n = 0; n < kPanel; ++n)
          rows[n] = r0 + n < s.rows ? unpack_block(s, r0 + n, b) : _mm512_setzero_si512();
        avx512::transpose16(rows);  // rows[pair] = that column pair of the 16 rows: a B-tile row
        for (size_t q = 0; q < 16; ++q) _mm512_store_si512(dst + b * 512 + q * 32, rows[q]);
      }
      float* sc = scale.data() + i * sstride;
      float* mn = min.data() + i * mstride;
      for (size_t n = 0; n < kPanel; ++n) {
        const bool have = r0 + n < s.rows;
        if (s.e8m0_scales)
          for (size_t g = 0; g < ng; ++g)
            sc[n + g * kPanel] = have ? e8m0_half(s.scales8[(r0 + n) * ng + g]) : 0.0f;
        else
          column(s.scales.data(), s.half_scales ? s.scales16.data() : nullptr, (r0 + n) * ng, ng,
                 have, sc + n);
        if (s.has_min)
          column(s.mins.data(), s.half_scales ? s.mins16.data() : nullptr, (r0 + n) * ng, ng, have,
                 mn + n);
      }
    }
  }
  uint16_t* wdata() {  // 64-byte aligned for the tile rows
    const auto addr = reinterpret_cast<uintptr_t>(w.data());
    return w.data() + ((64 - addr % 64) % 64) / sizeof(uint16_t);
  }
  PanelView panel(size_t i) {
    return {wdata() + i * wstride, scale.data() + i * sstride,
            mstride ? min.data() + i * mstride : nullptr};
  }
};

}  // namespace
}  // namespace edgellm::kernels::quant_panels
