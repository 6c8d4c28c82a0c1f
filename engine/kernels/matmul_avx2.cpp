// bf16-weight x fp32-activation matmul for AVX2+FMA: y[t][r] = sum_c x[t][c] W[r][c].
//
// Layout (pack): rows in panels of 16; a panel is stored k-major, 16 bf16 per
// column = one 32-byte load, in the order (r0, r8, r1, r9, ..., r7, r15) so
// that `v << 16` yields rows 0..7 and `v & 0xffff0000` rows 8..15 as fp32.
// The last panel is zero-padded; columns need no padding.
//
// n == 1 (decode, GEMV) is bandwidth bound: each thread streams a contiguous
// run of panels once; per column one 32-byte weight load and one broadcast of
// x feed two FMAs, with four columns in flight (8 accumulators) to cover the
// FMA latency. Lanes are rows, so no horizontal sums. matmul_rows (batched
// decode) runs that GEMV for each of n tokens while the panel is in L1/L2, so
// the weights stream once per step and each row is bit-identical to n == 1.
//
// n > 1 (prefill, GEMM) is compute bound: per k-block of <= kKcMax columns a
// thread converts one panel to fp32 into an L1-resident buffer (16 x kc), then
// runs a 6-token x 16-row register tile over all tokens: per column 2 loads of
// the panel, 6 broadcasts of x and 12 FMAs into 12 accumulators. The panel is
// reused across every token from L1; the x block (tokens x kc) stays in L2.
#include <algorithm>
#include <cstring>

#include "edgellm/bf16.h"
#include "kernels/avx2.h"
#include "kernels/vec_avx2.h"

namespace edgellm::kernels::avx2 {

namespace {

// k-block: the fp32 panel (kKcMax x 16 x 4 B = 16 KiB) plus a 6-token x slice
// (6 KiB) fit a 32 KiB L1.
constexpr size_t kKcMax = 256;
// Tokens per register tile: 6 x 2 accumulators + 2 panel vectors + 1 broadcast
// = 15 of the 16 ymm registers.
constexpr size_t kTileTokens = 6;
// Tokens swept per converted panel; the x block (kTokenBlock x kc x 4 B =
// 192 KiB) stays in L2 while the panel stays in L1. Beyond it the panel is
// simply converted again (about 3% extra work).
constexpr size_t kTokenBlock = 192;

// GEMV software prefetch distance. The hardware prefetcher alone left the
// DRAM-streaming GEMV at ~88% of the measured read bandwidth on the dev box;
// 1 KiB ahead brought it to ~100% (4 KiB: ~92%). Prefetching past the end of
// a thread's range is harmless (prefetches do not fault).
constexpr size_t kGemvPrefetch = 1024;

const uint16_t* panel_base(const PackedMatrix& w) {
  return w.data.data() + w.offset;
}

// Stores (first k-block: y = acc + bias) or accumulates (y += acc) the 16
// lanes of one tile row, only the first `valid` of them.
inline void store_row(float* y, __m256 lo, __m256 hi, bool first, const float* bias, size_t valid) {
  if (valid == kPanelRows) {
    if (first) {
      if (bias) {
        lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias));
        hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + 8));
      }
    } else {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(y));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(y + 8));
    }
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  const __m256i mlo = lane_mask(std::min<size_t>(valid, 8));
  const __m256i mhi = lane_mask(valid > 8 ? valid - 8 : 0);
  if (first) {
    if (bias) {
      lo = _mm256_add_ps(lo, _mm256_maskload_ps(bias, mlo));
      hi = _mm256_add_ps(hi, _mm256_maskload_ps(bias + 8, mhi));
    }
  } else {
    lo = _mm256_add_ps(lo, _mm256_maskload_ps(y, mlo));
    hi = _mm256_add_ps(hi, _mm256_maskload_ps(y + 8, mhi));
  }
  _mm256_maskstore_ps(y, mlo, lo);
  _mm256_maskstore_ps(y + 8, mhi, hi);
}

// --- GEMV ---------------------------------------------------------------------

void gemv_panels(const PackedMatrix& w, const float* x, float* y, size_t p0, size_t p1) {
  const size_t cols = w.cols;
  const uint16_t* base = panel_base(w);
  for (size_t p = p0; p < p1; ++p) {
    const uint16_t* wp = base + p * cols * kPanelRows;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      const uint16_t* wc = wp + c * kPanelRows;
      // One prefetch per cache line, kGemvPrefetch bytes ahead of the loads.
      _mm_prefetch(reinterpret_cast<const char*>(wc) + kGemvPrefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wc) + kGemvPrefetch + 64, _MM_HINT_T0);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + 16));
      const __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + 32));
      const __m256i v3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + 48));
      const __m256 x0 = _mm256_broadcast_ss(x + c), x1 = _mm256_broadcast_ss(x + c + 1);
      const __m256 x2 = _mm256_broadcast_ss(x + c + 2), x3 = _mm256_broadcast_ss(x + c + 3);
      a0 = _mm256_fmadd_ps(bf16_lo(v0), x0, a0);
      a1 = _mm256_fmadd_ps(bf16_hi(v0), x0, a1);
      a2 = _mm256_fmadd_ps(bf16_lo(v1), x1, a2);
      a3 = _mm256_fmadd_ps(bf16_hi(v1), x1, a3);
      a4 = _mm256_fmadd_ps(bf16_lo(v2), x2, a4);
      a5 = _mm256_fmadd_ps(bf16_hi(v2), x2, a5);
      a6 = _mm256_fmadd_ps(bf16_lo(v3), x3, a6);
      a7 = _mm256_fmadd_ps(bf16_hi(v3), x3, a7);
    }
    for (; c < cols; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + c * kPanelRows));
      const __m256 xc = _mm256_broadcast_ss(x + c);
      a0 = _mm256_fmadd_ps(bf16_lo(v), xc, a0);
      a1 = _mm256_fmadd_ps(bf16_hi(v), xc, a1);
    }
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a4, a6));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a1, a3), _mm256_add_ps(a5, a7));
    const size_t r0 = p * kPanelRows;
    store_row(y + r0, lo, hi, /*first=*/true, w.bias ? w.bias + r0 : nullptr,
              std::min(kPanelRows, w.rows - r0));
  }
}

// --- GEMM ---------------------------------------------------------------------

// Converts columns [k0, k0 + kc) of one panel to fp32: out[k][0..15] = rows 0..15.
void convert_panel(const uint16_t* wp, size_t k0, size_t kc, float* out) {
  const uint16_t* src = wp + k0 * kPanelRows;
  for (size_t k = 0; k < kc; ++k) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k * kPanelRows));
    _mm256_store_ps(out + k * kPanelRows, bf16_lo(v));
    _mm256_store_ps(out + k * kPanelRows + 8, bf16_hi(v));
  }
}

// C[MR tokens][16 rows] (+)= A[MR][kc] * B[kc][16]; A rows are lda apart.
template <int MR>
void tile(const float* a, size_t lda, const float* b, size_t kc, float* c, size_t ldc, bool first,
          const float* bias, size_t valid) {
  // The unroll pragmas make GCC keep the accumulator arrays in registers.
  __m256 lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  for (size_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kPanelRows);
    const __m256 b1 = _mm256_load_ps(b + k * kPanelRows + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(a + i * lda + k);
      lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
      hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) store_row(c + i * ldc, lo[i], hi[i], first, bias, valid);
}

using TileFn = void (*)(const float*, size_t, const float*, size_t, float*, size_t, bool,
                        const float*, size_t);
constexpr TileFn kTiles[kTileTokens + 1] = {nullptr, tile<1>, tile<2>, tile<3>,
                                            tile<4>, tile<5>, tile<6>};

void gemm_panels(const PackedMatrix& w, const float* x, size_t n, float* y, size_t p0, size_t p1) {
  const size_t K = w.cols, rows = w.rows;
  const uint16_t* base = panel_base(w);
  // Equal k-blocks (e.g. 576 -> 3 x 192) rather than 256 + 256 + 64.
  const size_t n_kblocks = (K + kKcMax - 1) / kKcMax;
  const size_t kc_size = (K + n_kblocks - 1) / n_kblocks;
  thread_local Scratch scratch;
  float* panel = scratch.get(kKcMax * kPanelRows);
  for (size_t k0 = 0; k0 < K; k0 += kc_size) {
    const size_t kc = std::min(kc_size, K - k0);
    const bool first = k0 == 0;
    for (size_t t0 = 0; t0 < n; t0 += kTokenBlock) {
      const size_t t1 = std::min(n, t0 + kTokenBlock);
      for (size_t p = p0; p < p1; ++p) {
        convert_panel(base + p * K * kPanelRows, k0, kc, panel);
        const size_t r0 = p * kPanelRows;
        const size_t valid = std::min(kPanelRows, rows - r0);
        const float* bias = w.bias ? w.bias + r0 : nullptr;
        for (size_t t = t0; t < t1; t += kTileTokens) {
          const size_t mr = std::min(kTileTokens, t1 - t);
          kTiles[mr](x + t * K + k0, K, panel, kc, y + t * rows + r0, rows, first, bias, valid);
        }
      }
    }
  }
}

// Batched decode (matmul_rows). Each panel is converted to fp32 once per
// k-block of kKcMax columns (a multiple of 4, so the column groups line up with
// the GEMV's); every token then runs the GEMV's exact FMA sequence on it, its 8
// accumulators parked in memory between k-blocks. The conversion is exact, so
// each row equals the n == 1 GEMV bit for bit, while the bf16 -> fp32 work is
// paid once per panel instead of once per token.
void gemv_rows(const PackedMatrix& w, const float* x, size_t n, float* y, size_t p0, size_t p1) {
  const size_t cols = w.cols, body = cols / 4 * 4;
  const uint16_t* base = panel_base(w);
  thread_local Scratch panel_scratch, acc_scratch;
  float* panel = panel_scratch.get(kKcMax * kPanelRows);
  float* acc = acc_scratch.get(n * 64);  // per token: a0..a7, 8 floats each
  for (size_t p = p0; p < p1; ++p) {
    const uint16_t* wp = base + p * cols * kPanelRows;
    std::fill(acc, acc + n * 64, 0.0f);
    for (size_t k0 = 0; k0 < cols; k0 += kKcMax) {
      const size_t kc = std::min(kKcMax, cols - k0);
      const size_t grouped = body > k0 ? std::min(kc, body - k0) : 0;  // the rest is the tail
      convert_panel(wp, k0, kc, panel);
      for (size_t t = 0; t < n; ++t) {
        const float* xt = x + t * cols + k0;
        float* at = acc + t * 64;
        __m256 a0 = _mm256_load_ps(at), a1 = _mm256_load_ps(at + 8);
        __m256 a2 = _mm256_load_ps(at + 16), a3 = _mm256_load_ps(at + 24);
        __m256 a4 = _mm256_load_ps(at + 32), a5 = _mm256_load_ps(at + 40);
        __m256 a6 = _mm256_load_ps(at + 48), a7 = _mm256_load_ps(at + 56);
        size_t c = 0;
        for (; c < grouped; c += 4) {
          const float* wc = panel + c * kPanelRows;
          const __m256 x0 = _mm256_broadcast_ss(xt + c), x1 = _mm256_broadcast_ss(xt + c + 1);
          const __m256 x2 = _mm256_broadcast_ss(xt + c + 2), x3 = _mm256_broadcast_ss(xt + c + 3);
          a0 = _mm256_fmadd_ps(_mm256_load_ps(wc), x0, a0);
          a1 = _mm256_fmadd_ps(_mm256_load_ps(wc + 8), x0, a1);
          a2 = _mm256_fmadd_ps(_mm256_load_ps(wc + 16), x1, a2);
          a3 = _mm256_fmadd_ps(_mm256_load_ps(wc + 24), x1, a3);
          a4 = _mm256_fmadd_ps(_mm256_load_ps(wc + 32), x2, a4);
          a5 = _mm256_fmadd_ps(_mm256_load_ps(wc + 40), x2, a5);
          a6 = _mm256_fmadd_ps(_mm256_load_ps(wc + 48), x3, a6);
          a7 = _mm256_fmadd_ps(_mm256_load_ps(wc + 56), x3, a7);
        }
        for (; c < kc; ++c) {
          const __m256 xc = _mm256_broadcast_ss(xt + c);
          a0 = _mm256_fmadd_ps(_mm256_load_ps(panel + c * kPanelRows), xc, a0);
          a1 = _mm256_fmadd_ps(_mm256_load_ps(panel + c * kPanelRows + 8), xc, a1);
        }
        _mm256_store_ps(at, a0), _mm256_store_ps(at + 8, a1);
        _mm256_store_ps(at + 16, a2), _mm256_store_ps(at + 24, a3);
        _mm256_store_ps(at + 32, a4), _mm256_store_ps(at + 40, a5);
        _mm256_store_ps(at + 48, a6), _mm256_store_ps(at + 56, a7);
      }
    }
    const size_t r0 = p * kPanelRows;
    for (size_t t = 0; t < n; ++t) {
      const float* at = acc + t * 64;
      const __m256 lo =
          _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(at), _mm256_load_ps(at + 16)),
                        _mm256_add_ps(_mm256_load_ps(at + 32), _mm256_load_ps(at + 48)));
      const __m256 hi =
          _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(at + 8), _mm256_load_ps(at + 24)),
                        _mm256_add_ps(_mm256_load_ps(at + 40), _mm256_load_ps(at + 56)));
      store_row(y + t * w.rows + r0, lo, hi, /*first=*/true, w.bias ? w.bias + r0 : nullptr,
                std::min(kPanelRows, w.rows - r0));
    }
  }
}

}  // namespace

void pack(const uint16_t* src, size_t rows, size_t cols, PackedMatrix& out) {
  const size_t panels = (rows + kPanelRows - 1) / kPanelRows;
  out.rows = rows;
  out.cols = cols;
  out.isa = Isa::avx2;
  // 32 spare elements (64 bytes) so the layout can start on a cache line.
  out.data.assign(panels * cols * kPanelRows + 32, 0);
  const auto addr = reinterpret_cast<uintptr_t>(out.data.data());
  out.offset = ((64 - addr % 64) % 64) / sizeof(uint16_t);
  uint16_t* base = out.data.data() + out.offset;
  for (size_t r = 0; r < rows; ++r) {
    const size_t p = r / kPanelRows, j = r % kPanelRows;
    const size_t lane = j < 8 ? 2 * j : 2 * (j - 8) + 1;
    uint16_t* dst = base + p * cols * kPanelRows + lane;
    const uint16_t* row = src + r * cols;
    for (size_t c = 0; c < cols; ++c) dst[c * kPanelRows] = row[c];
  }
}

void unpack_row(const PackedMatrix& w, size_t r, float* out) {
  const size_t p = r / kPanelRows, j = r % kPanelRows;
  const size_t lane = j < 8 ? 2 * j : 2 * (j - 8) + 1;
  const uint16_t* src = panel_base(w) + p * w.cols * kPanelRows + lane;
  for (size_t c = 0; c < w.cols; ++c) out[c] = bf16_to_float(src[c * kPanelRows]);
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  if (n == 0 || w.rows == 0) return;
  const size_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
  if (w.cols == 0) {  // empty sum: y = bias
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < w.rows; ++r) y[t * w.rows + r] = w.bias ? w.bias[r] : 0.0f;
    return;
  }
  if (n == 1) {
    pool.parallel_chunks(panels, [&](size_t p0, size_t p1) { gemv_panels(w, x, y, p0, p1); });
  } else {
    pool.parallel_chunks(panels, [&](size_t p0, size_t p1) { gemm_panels(w, x, n, y, p0, p1); });
  }
}

void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  if (n <= 1 || w.rows == 0 || w.cols == 0) return avx2::matmul(w, x, n, y, pool);
  const size_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
  pool.parallel_chunks(panels, [&](size_t p0, size_t p1) { gemv_rows(w, x, n, y, p0, p1); });
}

}  // namespace edgellm::kernels::avx2
