// A c4 segment's codebook (kernels/quant.h) as the 16 bytes every SIMD c4
// kernel builds its lookup table from, once per call or tile. Under
// Fault::c4_codes_as_values it is the identity 0..15 instead: the codes
// multiplied as if they were the values, the bug the kernels' tests must catch.
// Internal linkage, as each includer is built for its own ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/fault_injection.h"

namespace edgellm::kernels {
namespace {

inline __m128i c4_codebook_bytes(const int8_t* codebook) {
  if (fault::active() == fault::Fault::c4_codes_as_values)
    return _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook));
}

}  // namespace
}  // namespace edgellm::kernels
