// Quantized decode GEMV with bf16 activations on AVX-512 BF16 (VDPBF16PS), the
// fast config's path below kMinBf16QuantTokens tokens (kernels/quant.h):
//   y[t][r] = sum_b scale[r,b] * sum_{j in b} (q[r,j] - zero) xb[t,j]
//             + min[r,b] * sum_{j in b} xb[t,j]
// with xb = bf16(x) rounded to nearest even once per call, as the prefill
// (quant_bf16_avx512.cpp) rounds it: (q - zero) is exact in bf16, its products
// with xb exact in fp32, the scales and mins applied in fp32.
//
// Why: the fp32 GEMV spends 7 vector instructions per u4 block of 32 (unpack
// to fp32, two FMAs, the scale) and ran at ~12 GB/s a core on L2-resident
// weights, below one core's share of DRAM (quant_gemv_bench). Here a block
// pair of a row is one widening load, one shift, two VPERMW table lookups (the
// bf16 of q - zero; for u4 the table repeats after 16, so the low nibble needs
// no mask), two VDPBF16PS and one scaled FMA: ~4 instructions a block (17-21
// GB/s a core). u5 adds a mask, two masked adds and the fifth bits' masks.
//
// Lanes: the pair's 2 x 16 low-bit bytes widen to 32 words, word i holding
// byte i % 16 of block b + i / 16; their low nibbles are elements 0..15 of
// both blocks, their high nibbles elements 16..31. x is laid out to match, per
// pair: xb[b][0..15], xb[b+1][0..15], xb[b][16..31], xb[b+1][16..31], so
// VDPBF16PS leaves block b in lanes 0..7 and block b + 1 in lanes 8..15, and
// one vector of the two scales (8 lanes each) scales both. An odd last block
// pairs with zeros.
//
// u4, u5 and c4 segments (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1; IQ4_NL, IQ4_XS, MXFP4:
// the table holds the codebook's values instead of q - zero) take it; i8 ones stay on
// the fp32 row kernel with fp32 x. Every token has its own GEMV's arithmetic
// whatever n, so batched decode (MatmulKernels::rows) equals n single-token
// calls bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/fault_injection.h"
#include "kernels/quant.h"
#include "kernels/quant_c4.h"
#include "kernels/vec_avx512.h"

namespace edgellm::kernels::avx512 {

namespace {

constexpr size_t kPairWords = 64;   // bf16 x per block pair
constexpr size_t kChunkPairs = 32;  // pairs whose scales are staged at a time
// Each row of a tile is its own stream: its weights this far ahead (past its
// end: the same row of the next tile). A distance over the tile's bytes instead
// (2048, as the fp32 GEMV) ran ahead on the first row only, and long rows
// (Qwen2.5 down, 8960 columns: 4480 bytes a row) streamed at 36% of the read
// bandwidth on one thread. 512 was slower again; 2048 no faster.
constexpr size_t kPrefetchRowBytes = 1024;

struct Acts {
  const uint16_t* xp;  // [n][pairs * 64] bf16 x in the pair layout above
  const float* sum;    // [n][nb] sums of xb per block (the mins' term)
  size_t n, nb, pairs;
};

// x of n tokens to the pair layout, nearest even (Fault::bf16_truncate:
// truncated), and the sums of the rounded blocks.
void pack_x(const float* x, size_t n, size_t cols, uint16_t* xp, float* sum) {
  const bool truncate = fault::active() == fault::Fault::bf16_truncate;
  const size_t nb = cols / 32, pairs = (nb + 1) / 2;
  for (size_t t = 0; t < n; ++t)
    for (size_t p = 0; p < pairs; ++p) {
      const float* a = x + t * cols + 2 * p * 32;
      const bool two = 2 * p + 1 < nb;
      const __m512 z = _mm512_setzero_ps();
      const __m512i lo = to_bf16(_mm512_loadu_ps(a), two ? _mm512_loadu_ps(a + 32) : z, truncate);
      const __m512i hi =
          to_bf16(_mm512_loadu_ps(a + 16), two ? _mm512_loadu_ps(a + 48) : z, truncate);
      uint16_t* o = xp + (t * pairs + p) * kPairWords;
      _mm512_storeu_si512(o, lo);
      _mm512_storeu_si512(o + 32, hi);
      // Block b + k's rounded values: words 16k..16k+15 of lo and of hi.
      for (size_t k = 0; k < (two ? 2u : 1u); ++k) {
        const auto widen = [&](__m512i v) {
          const __m256i h = k ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
          return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        };
        sum[t * nb + 2 * p + k] = _mm512_reduce_add_ps(_mm512_add_ps(widen(lo), widen(hi)));
      }
    }
}

// Scales [g0, g0 + n) of a segment as fp32 into out.
void stage(const QuantSegment& s, size_t g0, size_t n, float* out) {
  if (s.e8m0_scales) {
    e8m0_scales(s.scales8.data() + g0, n, out);
    return;
  }
  if (!s.half_scales) {
    std::memcpy(out, s.scales.data() + g0, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s.scales16.data() + g0 + i)));
  }
}

// The bf16 of the integer a code stands for, for index i < 32 (VPERMW reads an
// index's low 5 bits): u4 i % 16 - zero (the high nibble's lowest bit may sit
// in bit 4), u5 i - zero, c4 codebook[i % 16]. Small integers: exact.
__m512i value_table(const QuantSegment& s) {
  alignas(16) int8_t codebook[16];
  if (s.layout == QuantLayout::c4)
    _mm_store_si128(reinterpret_cast<__m128i*>(codebook), c4_codebook_bytes(s.codebook.data()));
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float v = static_cast<float>(s.layout == QuantLayout::c4   ? codebook[i % 16]
                                       : s.layout == QuantLayout::u4 ? i % 16 - s.zero
                                                                     : i - s.zero);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    t[i] = static_cast<uint16_t>(bits >> 16);
  }
  return _mm512_load_si512(t);
}

// The pair's q - zero (c4: codebook[q]) as bf16 words, low nibbles (elements 0..15 of both
// blocks) in lo, high nibbles (16..31) in hi. u5: the fifth bits (bit j of a
// block's uint32: element j) are added to the indices through two masks.
template <QuantLayout kL, bool kTwo>
inline void unpack_pair(const uint8_t* q, __m512i table, __m512bh& lo, __m512bh& hi) {
  constexpr size_t kBlock = layout_block_bytes(kL);
  __m256i bytes = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  constexpr bool kNibbles = kL != QuantLayout::u5;  // u4, c4: 16 bytes a block, no fifth bits
  if constexpr (kTwo && kNibbles)                   // the two blocks' 32 bytes are adjacent
    bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  else if constexpr (kTwo)
    bytes = _mm256_inserti128_si256(
        bytes, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + kBlock)), 1);
  const __m512i v = _mm512_cvtepu8_epi16(bytes);
  if constexpr (kNibbles) {
    lo = (__m512bh)_mm512_permutexvar_epi16(v, table);
    hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table);
  } else {
    uint32_t h0, h1 = 0;
    std::memcpy(&h0, q + 16, sizeof(h0));
    if constexpr (kTwo) std::memcpy(&h1, q + kBlock + 16, sizeof(h1));
    const __mmask32 klo = (h0 & 0xffffu) | (h1 << 16), khi = (h0 >> 16) | (h1 & 0xffff0000u);
    const __m512i sixteen = _mm512_set1_epi16(16);
    __m512i ilo = _mm512_and_si512(v, _mm512_set1_epi16(0x0f));
    __m512i ihi = _mm512_srli_epi16(v, 4);
    ilo = _mm512_mask_add_epi16(ilo, klo, ilo, sixteen);
    ihi = _mm512_mask_add_epi16(ihi, khi, ihi, sixteen);
    lo = (__m512bh)_mm512_permutexvar_epi16(ilo, table);
    hi = (__m512bh)_mm512_permutexvar_epi16(ihi, table);
  }
}

// Block pair p of rows q + i * row_bytes (i < R), or its block alone (kTwo
// false: the odd last block, paired with zeros), into acc for T tokens.
template <QuantLayout kL, int R, int T, bool kTwo>
inline void pair(const uint8_t* q, size_t row_bytes, const float (*sc)[2 * kChunkPairs], size_t k,
                 const Acts& a, size_t t0, size_t p, __m512i table, __m512 (*acc)[T]) {
  // Block b's scale in lanes 0..7, block b + 1's in 8..15.
  const __m512i pair_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    __m512bh wlo, whi;
    unpack_pair<kL, kTwo>(q + i * row_bytes, table, wlo, whi);
    const __m512 scale = _mm512_maskz_permutexvar_ps(
        kTwo ? __mmask16(0xffff) : __mmask16(0x00ff), pair_idx,
        _mm512_castps128_ps512(
            _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc[i] + k)))));
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const uint16_t* xq = a.xp + ((t0 + j) * a.pairs + p) * kPairWords;
      __m512 part = _mm512_dpbf16_ps(_mm512_setzero_ps(), wlo, (__m512bh)_mm512_loadu_si512(xq));
      part = _mm512_dpbf16_ps(part, whi, (__m512bh)_mm512_loadu_si512(xq + 32));
      acc[i][j] = _mm512_fmadd_ps(part, scale, acc[i][j]);
    }
  }
}

// Rows [r, r + R) x tokens [t0, t0 + T): each token's arithmetic its own.
template <QuantLayout kL, int R, int T>
void tile(const QuantSegment& s, const Acts& a, __m512i table, float* y, size_t ldy, size_t r,
          size_t t0) {
  constexpr size_t kBlock = layout_block_bytes(kL);
  const size_t nb = a.nb, row_bytes = nb * kBlock;
  __m512 acc[R][T];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  alignas(64) float sc[R][2 * kChunkPairs];
  const uint8_t* const tile_ptr = s.qs.data() + r * row_bytes;
  const uintptr_t tile_qs = reinterpret_cast<uintptr_t>(tile_ptr);
  constexpr size_t kPairBytes = 2 * kBlock;  // a row's bytes per pair
  // One prefetch a row per 64-byte line: every other pair when a pair is 32 bytes.
  constexpr size_t kPrefetchEvery = kPairBytes <= 32 ? 64 / kPairBytes : 1;
  constexpr size_t kPrefetchStep = kPrefetchEvery * kPairBytes;
  // Row i's stream runs through row i of the following tiles: the prefetch
  // point is `ahead_off` bytes into row i of the tile starting at `ahead_row`.
  // (No columns: no pairs, nothing to prefetch.)
  const size_t ahead_rows = row_bytes ? kPrefetchRowBytes / row_bytes : 0;
  size_t ahead_off = kPrefetchRowBytes - ahead_rows * row_bytes;
  uintptr_t ahead_row = tile_qs + ahead_rows * R * row_bytes;
  for (size_t p0 = 0; p0 < a.pairs; p0 += kChunkPairs) {
    const size_t p1 = std::min(a.pairs, p0 + kChunkPairs);
    const size_t b0 = 2 * p0, nblk = std::min(nb, 2 * p1) - b0;
    for (int i = 0; i < R; ++i) stage(s, (r + i) * nb + b0, nblk, sc[i]);
    for (size_t p = p0; p < p1; ++p) {
      // (An address, not a pointer: past the last tile it points nowhere, and a
      // prefetch never faults.)
      if (p % kPrefetchEvery == 0) {
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(ahead_row + ahead_off + i * row_bytes),
                       _MM_HINT_T0);
        ahead_off += kPrefetchStep;
        while (ahead_off >= row_bytes) {  // rows shorter than a step: several
          ahead_off -= row_bytes;
          ahead_row += R * row_bytes;
        }
      }
      if (2 * p + 1 < nb)
        pair<kL, R, T, true>(tile_ptr + p * 2 * kBlock, row_bytes, sc, 2 * (p - p0), a, t0, p,
                             table, acc);
      else
        pair<kL, R, T, false>(tile_ptr + p * 2 * kBlock, row_bytes, sc, 2 * (p - p0), a, t0, p,
                              table, acc);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    if (s.has_min) {
      const size_t m0 = (r + i) * nb;
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j)
        acc[i][j] =
            _mm512_add_ps(acc[i][j], dot_lanes(s.half_scales ? nullptr : s.mins.data() + m0,
                                               s.half_scales ? s.mins16.data() + m0 : nullptr,
                                               a.sum + (t0 + j) * nb, nb));
    }
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) y[(t0 + j) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
  }
}

// Rows [r, r + R) for all tokens: 4, 2, then 1 at a time.
template <QuantLayout kL, int R>
void row_tiles(const QuantSegment& s, const Acts& a, __m512i table, float* y, size_t ldy,
               size_t r) {
  size_t t = 0;
  for (; t + 4 <= a.n; t += 4) tile<kL, R, 4>(s, a, table, y, ldy, r, t);
  for (; t + 2 <= a.n; t += 2) tile<kL, R, 2>(s, a, table, y, ldy, r, t);
  for (; t < a.n; ++t) tile<kL, R, 1>(s, a, table, y, ldy, r, t);
}

template <QuantLayout kL>
void packed_rows(const QuantSegment& s, const Acts& a, float* y, size_t ldy, size_t r0, size_t r1) {
  const __m512i table = value_table(s);
  size_t r = r0;
  for (; r + 4 <= r1; r += 4) row_tiles<kL, 4>(s, a, table, y, ldy, r);
  for (; r < r1; ++r) row_tiles<kL, 1>(s, a, table, y, ldy, r);
}

}  // namespace

void quant_gemv_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  const size_t cols = w.cols, nb = cols / 32, pairs = (nb + 1) / 2;
  const auto packed = [](const QuantSegment& s) { return s.layout != QuantLayout::i8; };
  const bool any_packed = std::any_of(w.segments.begin(), w.segments.end(), packed);
  const bool all_packed = std::all_of(w.segments.begin(), w.segments.end(), packed);
  // The workers read the caller's buffers, not their own thread_locals.
  thread_local std::vector<uint16_t> xp_buf;
  thread_local std::vector<float> sum_buf, fp32_sum_buf, half_buf;
  Acts a{.xp = nullptr, .sum = nullptr, .n = n, .nb = nb, .pairs = pairs};
  if (any_packed) {
    xp_buf.resize(n * pairs * kPairWords);
    sum_buf.resize(n * nb);
    pack_x(x, n, cols, xp_buf.data(), sum_buf.data());
    a.xp = xp_buf.data();
    a.sum = sum_buf.data();
  }
  Fp32Acts fa{.x = x, .n = n, .cols = cols, .per_token = true};
  if (!all_packed) {
    fp32_sum_buf.resize(n * nb);
    block_sums(x, n, cols, fp32_sum_buf.data());
    fa.block_sum = fp32_sum_buf.data();
    if (std::any_of(w.segments.begin(), w.segments.end(),
                    [](const QuantSegment& s) { return s.mins_per_16(); })) {
      half_buf.resize(n * 2 * nb);
      block_sums(x, n, cols, half_buf.data(), 16);
      fa.half_sum = half_buf.data();
    }
  }
  pool.parallel_chunks(w.rows, [&](size_t r0, size_t r1) {
    size_t base = 0;  // first row of the segment
    for (const QuantSegment& s : w.segments) {
      const size_t lo = std::max(r0, base), hi = std::min(r1, base + s.rows);
      if (lo < hi) {
        if (s.layout == QuantLayout::u4)
          packed_rows<QuantLayout::u4>(s, a, y + base, w.rows, lo - base, hi - base);
        else if (s.layout == QuantLayout::u5)
          packed_rows<QuantLayout::u5>(s, a, y + base, w.rows, lo - base, hi - base);
        else if (s.layout == QuantLayout::c4)
          packed_rows<QuantLayout::c4>(s, a, y + base, w.rows, lo - base, hi - base);
        else
          quant_rows_fp32(s, fa, y + base, w.rows, lo - base, hi - base);
      }
      base += s.rows;
    }
  });
}

}  // namespace edgellm::kernels::avx512
