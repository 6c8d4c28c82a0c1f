// bf16-weight matmul for AVX-512 F/BW/VL/BF16 over the VNNI-pair layout
// (kernels/avx512.h): y[t][r] = sum_c x[t][c] W[r][c] (+ bias[r]).
//
// n == 1 (decode, GEMV) is bandwidth bound and keeps x in fp32: per column
// pair one 64-byte load gives both columns' 16 rows as fp32 (shift / mask),
// two broadcasts of x and two FMAs; four pairs in flight (8 accumulators).
//
// n > 1 (prefill, GEMM) is compute bound: x is rounded to bf16 once (row
// major, padded), and a 12-token x 32-row register tile runs vdpbf16ps (two
// products per lane, fp32 accumulation) over the whole K: per column pair
// 2 weight loads and 12 broadcasts of an x pair feed 24 vdpbf16ps into 24
// accumulators. With GemmPrecision::fp32 (and bf16x2, which only amx splits)
// the same tile keeps x in fp32 and runs two FMAs per pair instead (half the
// flop rate). The two panels (32 x K bf16) are reused by every tile of a token
// block from L1/L2; the block's x (<= 256 KiB) stays in L2.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/avx512.h"

namespace edgellm::kernels {

namespace vnni {

void pack(const uint16_t* src, size_t rows, size_t cols, Isa isa, PackedMatrix& out) {
  const size_t kpad = padded_cols(cols);
  out.rows = rows;
  out.cols = cols;
  out.isa = isa;
  // 32 spare elements (64 bytes) so the layout can start on a cache line.
  out.data.assign(panels(rows) * kpad * kPanelRows + 32, 0);
  const auto addr = reinterpret_cast<uintptr_t>(out.data.data());
  out.offset = ((64 - addr % 64) % 64) / sizeof(uint16_t);
  uint16_t* base = out.data.data() + out.offset;
  for (size_t r = 0; r < rows; ++r) {
    uint16_t* dst = base + (r / kPanelRows) * kpad * kPanelRows + 2 * (r % kPanelRows);
    const uint16_t* row = src + r * cols;
    for (size_t c = 0; c < cols; ++c) dst[(c / 2) * 2 * kPanelRows + c % 2] = row[c];
  }
}

void unpack_row(const PackedMatrix& w, size_t r, float* out) {
  const size_t kpad = padded_cols(w.cols);
  const uint16_t* src =
      w.data.data() + w.offset + (r / kPanelRows) * kpad * kPanelRows + 2 * (r % kPanelRows);
  for (size_t c = 0; c < w.cols; ++c) out[c] = bf16_to_float(src[(c / 2) * 2 * kPanelRows + c % 2]);
}

}  // namespace vnni

namespace avx512 {

namespace {

using vnni::kPanelRows;

// Same measured prefetch distance as the AVX2 GEMV (matmul_avx2.cpp).
constexpr size_t kGemvPrefetch = 1024;
constexpr size_t kTileTokens = 12;
// Token block: its bf16 x rows stay in L2 while the panels sweep over it.
constexpr size_t kBlockBytes = 256 * 1024;

inline __m512 bf16_even(__m512i v) {  // the pair's first column, as fp32
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
inline __m512 bf16_odd(__m512i v) {  // the pair's second column
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline __mmask16 row_mask(size_t valid) {
  return static_cast<__mmask16>(valid >= 16 ? 0xffffu : (1u << valid) - 1u);
}

// y[0 .. valid) = acc + bias.
inline void store_rows(float* y, __m512 acc, const float* bias, size_t valid) {
  const __mmask16 m = row_mask(valid);
  if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, bias));
  _mm512_mask_storeu_ps(y, m, acc);
}

// --- GEMV ---------------------------------------------------------------------

void gemv_panels(const PackedMatrix& w, const float* x, float* y, size_t p0, size_t p1) {
  const size_t cols = w.cols, kpad = vnni::padded_cols(cols), pairs = cols / 2;
  const uint16_t* base = w.data.data() + w.offset;
  for (size_t p = p0; p < p1; ++p) {
    const uint16_t* wp = base + p * kpad * kPanelRows;
    __m512 a[8];
    for (auto& v : a) v = _mm512_setzero_ps();
    size_t q = 0;
    for (; q + 4 <= pairs; q += 4) {
      const uint16_t* wq = wp + q * 2 * kPanelRows;
      _mm_prefetch(reinterpret_cast<const char*>(wq) + kGemvPrefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wq) + kGemvPrefetch + 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wq) + kGemvPrefetch + 128, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wq) + kGemvPrefetch + 192, _MM_HINT_T0);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const __m512i v = _mm512_load_si512(wq + u * 2 * kPanelRows);
        const float* xc = x + 2 * (q + u);
        a[2 * u] = _mm512_fmadd_ps(bf16_even(v), _mm512_set1_ps(xc[0]), a[2 * u]);
        a[2 * u + 1] = _mm512_fmadd_ps(bf16_odd(v), _mm512_set1_ps(xc[1]), a[2 * u + 1]);
      }
    }
    for (; q < pairs; ++q) {
      const __m512i v = _mm512_load_si512(wp + q * 2 * kPanelRows);
      a[0] = _mm512_fmadd_ps(bf16_even(v), _mm512_set1_ps(x[2 * q]), a[0]);
      a[1] = _mm512_fmadd_ps(bf16_odd(v), _mm512_set1_ps(x[2 * q + 1]), a[1]);
    }
    if (cols % 2) {  // the last column alone: x has no element past it
      const __m512i v = _mm512_load_si512(wp + pairs * 2 * kPanelRows);
      a[0] = _mm512_fmadd_ps(bf16_even(v), _mm512_set1_ps(x[cols - 1]), a[0]);
    }
    const __m512 s =
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                      _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
    const size_t r0 = p * kPanelRows;
    store_rows(y + r0, s, w.bias ? w.bias + r0 : nullptr, std::min(kPanelRows, w.rows - r0));
  }
}

// --- GEMM ---------------------------------------------------------------------

inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

inline __m512i broadcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// C[MR tokens][NP * 16 rows] = A[MR][kpad] * panels^T. `panel` points at the
// first panel; the second (NP == 2) is `pstride` after. With X = uint16_t, A
// is bf16 (rows lda apart, kpad wide, zero-padded) and each column pair is one
// vdpbf16ps; with X = float, A is the caller's fp32 x (cols wide) and each
// pair is two FMAs on the pair's columns widened to fp32.
template <typename X, int MR, int NP>
void tile(const X* a, size_t lda, const uint16_t* panel, size_t pstride, size_t cols, float* c,
          size_t ldc, const float* bias, size_t valid) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  constexpr bool kBf16 = std::is_same_v<X, uint16_t>;
  // bf16: every pair of the zero-padded row; fp32: whole pairs, then an odd last column.
  const size_t pairs = kBf16 ? vnni::padded_cols(cols) / 2 : cols / 2;
  for (size_t q = 0; q < pairs; ++q) {
    __m512i b[NP];
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) b[j] = _mm512_load_si512(panel + j * pstride + q * 2 * kPanelRows);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      if constexpr (kBf16) {
        const __m512i av = broadcast_pair(a + i * lda + 2 * q);
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) acc[i][j] = dp(acc[i][j], av, b[j]);
      } else {
        const __m512 x0 = _mm512_set1_ps(a[i * lda + 2 * q]);
        const __m512 x1 = _mm512_set1_ps(a[i * lda + 2 * q + 1]);
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j)
          acc[i][j] =
              _mm512_fmadd_ps(bf16_odd(b[j]), x1, _mm512_fmadd_ps(bf16_even(b[j]), x0, acc[i][j]));
      }
    }
  }
  if constexpr (!kBf16) {
    if (cols % 2) {
#pragma GCC unroll 2
      for (int j = 0; j < NP; ++j) {
        const __m512 w = bf16_even(_mm512_load_si512(panel + j * pstride + pairs * 2 * kPanelRows));
#pragma GCC unroll 12
        for (int i = 0; i < MR; ++i)
          acc[i][j] = _mm512_fmadd_ps(w, _mm512_set1_ps(a[i * lda + cols - 1]), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
      const size_t done = j * kPanelRows;
      if (valid > done)
        store_rows(c + i * ldc + done, acc[i][j], bias ? bias + done : nullptr, valid - done);
    }
}

template <typename X>
using TileFn = void (*)(const X*, size_t, const uint16_t*, size_t, size_t, float*, size_t,
                        const float*, size_t);

template <typename X, int NP, size_t... I>
constexpr auto make_tiles(std::index_sequence<I...>) {
  return std::array<TileFn<X>, sizeof...(I)>{tile<X, static_cast<int>(I) + 1, NP>...};
}
template <typename X>
constexpr auto kTiles1 = make_tiles<X, 1>(std::make_index_sequence<kTileTokens>{});
template <typename X>
constexpr auto kTiles2 = make_tiles<X, 2>(std::make_index_sequence<kTileTokens>{});

// Panels [p0, p1) for every token; x rows are lda apart (bf16: kpad, fp32: cols).
template <typename X>
void gemm_panels(const PackedMatrix& w, const X* x, size_t lda, size_t n, float* y, size_t p0,
                 size_t p1) {
  const size_t kpad = vnni::padded_cols(w.cols), rows = w.rows;
  const size_t pstride = kpad * kPanelRows;
  const uint16_t* base = w.data.data() + w.offset;
  const size_t block =
      std::max(kTileTokens, kBlockBytes / (lda * sizeof(X)) / kTileTokens * kTileTokens);
  for (size_t t0 = 0; t0 < n; t0 += block) {
    const size_t t1 = std::min(n, t0 + block);
    for (size_t p = p0; p < p1; p += 2) {
      const size_t np = std::min<size_t>(2, p1 - p);
      const size_t r0 = p * kPanelRows, valid = std::min(np * kPanelRows, rows - r0);
      const float* bias = w.bias ? w.bias + r0 : nullptr;
      for (size_t t = t0; t < t1; t += kTileTokens) {
        const size_t mr = std::min(kTileTokens, t1 - t);
        const auto& fns = np == 2 ? kTiles2<X> : kTiles1<X>;
        fns[mr - 1](x + t * lda, lda, base + p * pstride, pstride, w.cols, y + t * rows + r0, rows,
                    bias, valid);
      }
    }
  }
}

}  // namespace

uint16_t* bf16_scratch(size_t count) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < count + 32) buf.resize(count + 32);
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(uint16_t);
}

namespace {

// The split of 32 columns of one x row, `left` of them valid (the rest read as
// zero): part p goes to store(p, 32 bf16 as one __m512i).
template <typename Store>
inline void split_32(const float* xr, size_t left, size_t parts, Store&& store) {
  const __mmask16 m0 = row_mask(std::min<size_t>(left, 16));
  const __mmask16 m1 = row_mask(left > 16 ? left - 16 : 0);
  __m512 lo = _mm512_maskz_loadu_ps(m0, xr);
  __m512 hi = _mm512_maskz_loadu_ps(m1, xr + 16);
  for (size_t p = 0; p < parts; ++p) {
    // Round to nearest even, as torch's .to(bfloat16); result order (lo, hi).
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    store(p, v);
    // x - part is exact in fp32 (x's low-order bits): the next part rounds it.
    lo = _mm512_sub_ps(lo, bf16_even(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v))));
    hi = _mm512_sub_ps(hi, bf16_even(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1))));
  }
}

}  // namespace

void to_bf16_parts(const float* x, size_t n, size_t cols, size_t n_pad, size_t cols_pad,
                   size_t parts, uint16_t* out, ThreadPool& pool) {
  const size_t plane = n_pad * cols_pad;
  pool.parallel_chunks(n_pad, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const size_t have = t < n ? cols : 0;
      for (size_t c = 0; c < cols_pad; c += 32) {
        uint16_t* o = out + t * cols_pad + c;
        split_32(x + t * cols + c, c < have ? have - c : 0, parts,
                 [&](size_t p, __m512i v) { _mm512_storeu_si512(o + p * plane, v); });
      }
    }
  });
}

void to_bf16_tiles(const float* x, size_t n, size_t cols, size_t n_pad, size_t c0, size_t steps,
                   size_t parts, uint16_t* out) {
  for (size_t t = 0; t < n_pad; ++t) {
    const size_t have = t < n ? cols : 0;
    uint16_t* row = out + (t / 32) * steps * parts * 1024 + (t % 32 / 16) * 512 + t % 16 * 32;
    for (size_t s = 0; s < steps; ++s) {
      const size_t c = c0 + s * 32;
      uint16_t* o = row + s * parts * 1024;
      split_32(x + t * cols + c, c < have ? have - c : 0, parts,
               [&](size_t p, __m512i v) { _mm512_store_si512(o + p * 1024, v); });
    }
  }
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            GemmPrecision precision) {
  if (n == 0 || w.rows == 0) return;
  const size_t panels = vnni::panels(w.rows);
  if (n == 1) {
    pool.parallel_chunks(panels, [&](size_t p0, size_t p1) { gemv_panels(w, x, y, p0, p1); });
    return;
  }
  const size_t kpad = vnni::padded_cols(w.cols);
  if (kpad == 0) {  // empty sum: y = bias
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < w.rows; ++r) y[t * w.rows + r] = w.bias ? w.bias[r] : 0.0f;
    return;
  }
  // Threads split over pairs of panels (the tile's 32 rows).
  const size_t pairs = (panels + 1) / 2;
  if (precision != GemmPrecision::bf16) {  // fp32 and bf16x2: FMAs on exact x
    pool.parallel_chunks(pairs, [&](size_t q0, size_t q1) {
      gemm_panels(w, x, w.cols, n, y, 2 * q0, std::min(panels, 2 * q1));
    });
    return;
  }
  uint16_t* xb = bf16_scratch(n * kpad);
  to_bf16_parts(x, n, w.cols, n, kpad, 1, xb, pool);
  pool.parallel_chunks(pairs, [&](size_t q0, size_t q1) {
    gemm_panels(w, static_cast<const uint16_t*>(xb), kpad, n, y, 2 * q0, std::min(panels, 2 * q1));
  });
}

}  // namespace avx512

}  // namespace edgellm::kernels
