// bf16-weight matmul for AVX-512 F/BW/VL/BF16 over the VNNI-pair layout
// (kernels/avx512.h): y[t][r] = sum_c x[t][c] W[r][c] (+ bias[r]).
//
// n == 1 (decode, GEMV) is bandwidth bound and keeps x in fp32: per column
// pair one 64-byte load gives both columns' 16 rows as fp32 (shift / mask),
// two broadcasts of x and two FMAs; four pairs in flight (8 accumulators).
//
// n > 1 (prefill, GEMM) is compute bound. With GemmPrecision::bf16, x is
// rounded to bf16 once per call into the 12-token tile order the register
// tile reads (one contiguous stream per tile), and a 12-token x 32-row tile
// runs vdpbf16ps (two products per lane, fp32 accumulation): per column pair
// 2 weight loads and 12 broadcasts of an x pair feed 24 vdpbf16ps into 24
// accumulators. Loops: token blocks (x in L2) > K blocks (K > 2048 only) >
// panel pairs (the next pair's slice prefetched into L2 meanwhile) > tiles.
// On Zen 5 (2 vdpbf16ps zmm a cycle) it runs at 85-100% of that peak per core.
// With GemmPrecision::fp32 (and bf16x2, which only amx splits) a tile of the
// same shape keeps x in fp32 (row major) and runs two FMAs per pair instead
// (half the flop rate) over the whole K; the block's x (<= 256 KiB) stays in L2.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "edgellm/bf16.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/vec_avx512.h"

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

using fault::Fault;
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

// --- bf16 GEMM (vdpbf16ps) -------------------------------------------------------

// x as the bf16 GEMM reads it: per tile of kTileTokens tokens, per 32-column
// chunk, the tile's tokens one after another, 32 bf16 (64 bytes) each:
// element (t, c) at ((t / 12 * kchunks + c / 32) * 12 + t % 12) * 32 + c % 32.
// A tile's K block is one contiguous run and each chunk one 768-byte read.
constexpr size_t kChunk = vnni::kKBlock;  // columns per chunk (16 pairs)
constexpr size_t kTileChunk = kTileTokens * kChunk;

// K block (columns): the two panels' slice (32 rows x kKc bf16, 128 KiB) is
// read from L2 by every tile of the token block, and the next slice is
// prefetched meanwhile. Only K > kKc is split (Llama's down, K = 8192): each
// split costs a store and reload of the C tile, and 512 or 1024 (slice in L1)
// measured 5-15% slower on Zen 5 than 2048.
constexpr size_t kKc = 2048;
// Token block: its x over one K block (<= 256 KiB) stays in L2 next to the
// current and the prefetched W slice while the panel pairs sweep over it; W
// streams from L3/DRAM once per token block. (512 KiB measured the same.)
constexpr size_t kXBlockBytes = 256 * 1024;

// Lines [0, lines) after at[0] and at[1] (the next slice's two panels): a
// tile spreads its share of the prefetch over its chunks, so the next slice
// comes from L2, not DRAM, when its first tile starts.
struct Prefetch {
  const char* at[2];
  size_t lines;
};

// C[MR tokens][NP * 16 rows] (+)= x tile * panels^T over `chunks` 32-column
// chunks. xt: the tile at its first chunk; panel: the first panel at its first
// pair, the second (NP == 2) `pstride` after. The first K block starts from
// zero, later ones from C (fp32, as stored: the sum is one fp32 chain per
// output, in column order); the last adds the bias.
template <int MR, int NP>
void tile_bf16(const uint16_t* xt, const uint16_t* panel, size_t pstride, size_t chunks, float* c,
               size_t ldc, const float* bias, size_t valid, bool first, bool last,
               const Prefetch& pf) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
      const size_t done = j * kPanelRows;
      acc[i][j] = first || valid <= done
                      ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(row_mask(valid - done), c + i * ldc + done);
    }
  const size_t pf_step = (pf.lines + chunks - 1) / std::max<size_t>(chunks, 1);
  for (size_t ch = 0; ch < chunks; ++ch) {
    for (size_t l = ch * pf_step, e = std::min(pf.lines, l + pf_step); l < e; ++l) {
      _mm_prefetch(pf.at[0] + l * 64, _MM_HINT_T1);
      _mm_prefetch(pf.at[1] + l * 64, _MM_HINT_T1);
    }
    const uint16_t* xc = xt + ch * kTileChunk;
    const uint16_t* wc = panel + ch * kChunk * kPanelRows;
#pragma GCC unroll 16
    for (int u = 0; u < 16; ++u) {
      __m512i b[NP];
#pragma GCC unroll 2
      for (int j = 0; j < NP; ++j) b[j] = _mm512_load_si512(wc + j * pstride + u * 2 * kPanelRows);
#pragma GCC unroll 12
      for (int i = 0; i < MR; ++i) {
        const __m512i av = broadcast_pair(xc + i * kChunk + 2 * u);
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) acc[i][j] = dp(acc[i][j], av, b[j]);
      }
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
      const size_t done = j * kPanelRows;
      if (valid > done)
        store_rows(c + i * ldc + done, acc[i][j], last && bias ? bias + done : nullptr,
                   valid - done);
    }
}

using Bf16TileFn = void (*)(const uint16_t*, const uint16_t*, size_t, size_t, float*, size_t,
                            const float*, size_t, bool, bool, const Prefetch&);
template <int NP, size_t... I>
constexpr auto make_bf16_tiles(std::index_sequence<I...>) {
  return std::array<Bf16TileFn, sizeof...(I)>{tile_bf16<static_cast<int>(I) + 1, NP>...};
}
constexpr auto kBf16Tiles1 = make_bf16_tiles<1>(std::make_index_sequence<kTileTokens>{});
constexpr auto kBf16Tiles2 = make_bf16_tiles<2>(std::make_index_sequence<kTileTokens>{});

// Rounds tokens' x (cols floats a row) to bf16 in the tile layout above,
// tiles [i0, i1); columns >= cols and tokens >= n are zeros. Round to nearest
// even as torch's .to(bfloat16); Fault::bf16_truncate truncates instead.
void pack_x_tiles(const float* x, size_t n, size_t cols, size_t kchunks, size_t i0, size_t i1,
                  uint16_t* out) {
  const bool truncate = fault::active() == Fault::bf16_truncate;
  for (size_t i = i0; i < i1; ++i) {
    for (size_t k = 0; k < kTileTokens; ++k) {
      const size_t t = i * kTileTokens + k;
      const float* xr = t < n ? x + t * cols : x;
      for (size_t ch = 0; ch < kchunks; ++ch) {
        uint16_t* o = out + (i * kchunks + ch) * kTileChunk + k * kChunk;
        const size_t c = ch * kChunk, left = t < n && c < cols ? cols - c : 0;
        const __m512 lo = _mm512_maskz_loadu_ps(row_mask(std::min<size_t>(left, 16)), xr + c);
        const __m512 hi = _mm512_maskz_loadu_ps(row_mask(left > 16 ? left - 16 : 0), xr + c + 16);
        const __m512i v = to_bf16(lo, hi, truncate);
        _mm512_store_si512(o, v);
      }
    }
  }
}

// Panels [p0, p1) for every token over the packed x (kchunks chunks a tile).
void gemm_bf16_panels(const PackedMatrix& w, const uint16_t* xp, size_t n, size_t kchunks, float* y,
                      size_t p0, size_t p1) {
  const size_t rows = w.rows, kpad = kchunks * kChunk, pstride = kpad * kPanelRows;
  const uint16_t* base = w.data.data() + w.offset;
  // K blocks of near-equal size (whole chunks); Fault::drop_k_tail leaves the
  // last chunk out.
  const size_t kblocks = (kchunks * kChunk + kKc - 1) / kKc;
  const size_t kb_chunks = (kchunks + kblocks - 1) / kblocks;
  const size_t end_chunks = fault::active() == Fault::drop_k_tail ? kchunks - 1 : kchunks;
  const size_t tiles = (n + kTileTokens - 1) / kTileTokens;
  const size_t max_tiles =
      std::max<size_t>(1, kXBlockBytes / (kb_chunks * kTileChunk * sizeof(uint16_t)));
  const size_t tblocks = (tiles + max_tiles - 1) / max_tiles;
  const size_t block_tiles = (tiles + tblocks - 1) / tblocks;
  for (size_t i0 = 0; i0 < tiles; i0 += block_tiles) {
    const size_t i1 = std::min(tiles, i0 + block_tiles);
    for (size_t c0 = 0; c0 < kchunks; c0 += kb_chunks) {
      const size_t c1 = std::min(kchunks, c0 + kb_chunks);
      const bool first = c0 == 0, last = c1 == kchunks;
      const size_t chunks = std::min(c1, end_chunks) - std::min(c0, end_chunks);
      for (size_t p = p0; p < p1; p += 2) {
        const size_t np = std::min<size_t>(2, p1 - p);
        const size_t r0 = p * kPanelRows, valid = std::min(np * kPanelRows, rows - r0);
        const float* bias = w.bias ? w.bias + r0 : nullptr;
        const uint16_t* panel = base + p * pstride + c0 * kChunk * kPanelRows;
        // The slice after this one in the loop order (here: none after the last).
        size_t nc0 = c0, np0 = p + 2, next_chunks = 0;
        if (np0 >= p1) {
          np0 = p0;
          nc0 = c1 < kchunks ? c1 : i1 < tiles ? 0 : kchunks;
        }
        if (nc0 < kchunks) next_chunks = std::min(kchunks, nc0 + kb_chunks) - nc0;
        const char* next =
            reinterpret_cast<const char*>(base + np0 * pstride + nc0 * kChunk * kPanelRows);
        const char* next1 = np0 + 1 < p1 ? next + pstride * sizeof(uint16_t) : next;
        const size_t lines = next_chunks * kChunk * kPanelRows * sizeof(uint16_t) / 64;
        const auto& fns = np == 2 ? kBf16Tiles2 : kBf16Tiles1;
        for (size_t i = i0; i < i1; ++i) {
          const size_t t = i * kTileTokens, mr = std::min(kTileTokens, n - t);
          const size_t l0 = lines * (i - i0) / (i1 - i0), l1 = lines * (i + 1 - i0) / (i1 - i0);
          const Prefetch pf{{next + l0 * 64, next1 + l0 * 64}, l1 - l0};
          fns[mr - 1](xp + (i * kchunks + c0) * kTileChunk, panel, pstride, chunks,
                      y + t * rows + r0, rows, bias, valid, first, last, pf);
        }
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
// zero): part p goes to store(p, 32 bf16 as one __m512i). Fault::bf16_truncate
// (`truncate`) truncates each part instead of rounding it.
template <typename Store>
inline void split_32(const float* xr, size_t left, size_t parts, bool truncate, Store&& store) {
  const __mmask16 m0 = row_mask(std::min<size_t>(left, 16));
  const __mmask16 m1 = row_mask(left > 16 ? left - 16 : 0);
  __m512 lo = _mm512_maskz_loadu_ps(m0, xr);
  __m512 hi = _mm512_maskz_loadu_ps(m1, xr + 16);
  for (size_t p = 0; p < parts; ++p) {
    const __m512i v = to_bf16(lo, hi, truncate);
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
  const bool truncate = fault::active() == Fault::bf16_truncate;
  pool.parallel_chunks(n_pad, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const size_t have = t < n ? cols : 0;
      for (size_t c = 0; c < cols_pad; c += 32) {
        uint16_t* o = out + t * cols_pad + c;
        split_32(x + t * cols + c, c < have ? have - c : 0, parts, truncate,
                 [&](size_t p, __m512i v) { _mm512_storeu_si512(o + p * plane, v); });
      }
    }
  });
}

void to_bf16_tiles(const float* x, size_t n, size_t cols, size_t n_pad, size_t c0, size_t steps,
                   size_t parts, uint16_t* out) {
  const bool truncate = fault::active() == Fault::bf16_truncate;
  for (size_t t = 0; t < n_pad; ++t) {
    const size_t have = t < n ? cols : 0;
    uint16_t* row = out + (t / 32) * steps * parts * 1024 + (t % 32 / 16) * 512 + t % 16 * 32;
    for (size_t s = 0; s < steps; ++s) {
      const size_t c = c0 + s * 32;
      uint16_t* o = row + s * parts * 1024;
      split_32(x + t * cols + c, c < have ? have - c : 0, parts, truncate,
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
  const size_t kchunks = kpad / kChunk, tiles = (n + kTileTokens - 1) / kTileTokens;
  uint16_t* xp = bf16_scratch(tiles * kchunks * kTileChunk);
  pool.parallel_chunks(
      tiles, [&](size_t i0, size_t i1) { pack_x_tiles(x, n, w.cols, kchunks, i0, i1, xp); });
  pool.parallel_chunks(pairs, [&](size_t q0, size_t q1) {
    gemm_bf16_panels(w, xp, n, kchunks, y, 2 * q0, std::min(panels, 2 * q1));
  });
}

}  // namespace avx512

}  // namespace edgellm::kernels
