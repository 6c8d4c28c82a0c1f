// Batched decode (matmul_rows) with AVX-512, each row bit-identical to the
// n == 1 GEMV of its layout, with the weights read once for all tokens.
//
// VNNI-pair layout (avx512/amx packing; GEMV: gemv_panels in
// matmul_avx512.cpp): the GEMV keeps 8 accumulators per panel; pair q of the
// first 4 * (pairs / 4) pairs goes into a[2 (q % 4)] (even column) and
// a[2 (q % 4) + 1] (odd column), the remaining pairs and an odd last column
// into a[0] / a[1], and the panel's sum is ((a0 + a1) + (a2 + a3)) +
// ((a4 + a5) + (a6 + a7)) + bias. So accumulator pair u only ever sees the
// pairs q = u (mod 4): the batch sweeps a panel four times, once per u, with
// that pair of accumulators for up to 8 tokens in 16 registers. Every 64-byte
// pair is loaded and widened to fp32 once per 8 tokens, and each token's
// accumulators see the GEMV's FMAs in the GEMV's order. Each step prefetches
// one line of the next panel into L2, in address order, so the next panel
// streams in evenly over all four sweeps while they compute. (Measured on the
// 2-core dev VM, all SmolLM2 matrices, 8 tokens: no prefetch 35 ms, the next
// panel's pairs in sweep order into L1 20 ms, in address order into L2 15 ms,
// against 12 ms for one token's GEMV.)
//
// AVX2 panel layout (CPUs with AVX-512 running the avx2 tier): a converted panel column is 16 fp32
// = one zmm whose lanes 0..7 are the AVX2 GEMV's "lo" rows and 8..15 its "hi" rows, so one zmm FMA
// does the work of the GEMV's two ymm FMAs with the same per-lane arithmetic.
// Four zmm accumulators per token mirror a0|a1, a2|a3, a4|a5, a6|a7 and are
// summed in the GEMV's order, so each row is bit-identical to the AVX2 n == 1
// GEMV. Four tokens share each weight load (16 accumulators of 32 registers).
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx2.h"
#include "kernels/avx512.h"
#include "kernels/matmul_rows_avx512.h"
#include "kernels/vec_avx2.h"

namespace edgellm::kernels::avx512 {

namespace {

constexpr size_t kKc = 256;  // columns per converted block (a multiple of 4)
constexpr size_t kRows = avx2::kPanelRows;

// Columns [k0, k0 + kc) of one AVX2 panel as fp32, one zmm (rows 0..15) per
// column. Meanwhile it prefetches the block that comes next (`next`): the
// sweeps over this block then hide that block's DRAM latency, which the
// hardware prefetcher alone does not (the reads come in bursts).
void convert(const uint16_t* wp, size_t k0, size_t kc, const uint16_t* next, float* out) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (size_t k = 0; k < kc; ++k) {
    if (k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + k * kRows), _MM_HINT_T0);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + (k0 + k) * kRows));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + k * kRows), _mm256_slli_epi32(v, 16));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + k * kRows + 8), _mm256_and_si256(v, high));
  }
}

// T tokens over one converted block: `grouped` columns in the GEMV's groups of
// four, then the tail columns up to kc into accumulator 0.
template <int T>
void sweep(const float* panel, size_t grouped, size_t kc, const float* x, size_t ldx, float* acc) {
  __m512 a[T][4];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < 4; ++j) a[t][j] = _mm512_load_ps(acc + t * 64 + j * 16);
  size_t c = 0;
  for (; c < grouped; c += 4) {
    const float* wc = panel + c * kRows;
    const __m512 w0 = _mm512_load_ps(wc), w1 = _mm512_load_ps(wc + 16);
    const __m512 w2 = _mm512_load_ps(wc + 32), w3 = _mm512_load_ps(wc + 48);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const float* xt = x + t * ldx + c;
      a[t][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xt[0]), a[t][0]);
      a[t][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xt[1]), a[t][1]);
      a[t][2] = _mm512_fmadd_ps(w2, _mm512_set1_ps(xt[2]), a[t][2]);
      a[t][3] = _mm512_fmadd_ps(w3, _mm512_set1_ps(xt[3]), a[t][3]);
    }
  }
  for (; c < kc; ++c) {
    const __m512 wc = _mm512_load_ps(panel + c * kRows);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
      a[t][0] = _mm512_fmadd_ps(wc, _mm512_set1_ps(x[t * ldx + c]), a[t][0]);
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < 4; ++j) _mm512_store_ps(acc + t * 64 + j * 16, a[t][j]);
}

using SweepFn = void (*)(const float*, size_t, size_t, const float*, size_t, float*);
constexpr SweepFn kSweeps[5] = {nullptr, sweep<1>, sweep<2>, sweep<3>, sweep<4>};

// ---- VNNI-pair layout ----------------------------------------------------------

constexpr size_t kVnniRows = vnni::kPanelRows;
constexpr size_t kMaxTokens = 8;  // per sweep: 16 accumulators + 3 for the pair

inline __m512 bf16_even(__m512i v) {  // the pair's first column, as fp32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
inline __m512 bf16_odd(__m512i v) {  // the pair's second column
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Accumulators 2u and 2u + 1 of T tokens over panel `wp`: the grouped pairs
// q = u, u + 4, ... below `grouped`, and for u == 0 the tail pairs and an odd
// last column as well. acc[t * 8 + j] (16 floats each) receives token t's a[j].
// Each step prefetches the line at `next` and advances it.
template <int T>
void sweep_vnni(const uint16_t* wp, const char*& next, size_t u, size_t grouped, size_t pairs,
                size_t cols, const float* x, size_t ldx, float* acc) {
  __m512 e[T], o[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) e[t] = o[t] = _mm512_setzero_ps();
  const auto step = [&](size_t q) {
    _mm_prefetch(next, _MM_HINT_T1);
    next += 64;
    const __m512i v = _mm512_load_si512(wp + q * 2 * kVnniRows);
    const __m512 we = bf16_even(v), wo = bf16_odd(v);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const float* xq = x + t * ldx + 2 * q;
      e[t] = _mm512_fmadd_ps(we, _mm512_set1_ps(xq[0]), e[t]);
      o[t] = _mm512_fmadd_ps(wo, _mm512_set1_ps(xq[1]), o[t]);
    }
  };
  for (size_t q = u; q < grouped; q += 4) step(q);
  if (u == 0) {
    for (size_t q = grouped; q < pairs; ++q) step(q);
    if (cols % 2) {  // the last column alone: x has no element past it
      const __m512 we = bf16_even(_mm512_load_si512(wp + pairs * 2 * kVnniRows));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        e[t] = _mm512_fmadd_ps(we, _mm512_set1_ps(x[t * ldx + cols - 1]), e[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    _mm512_store_ps(acc + (t * 8 + 2 * u) * 16, e[t]);
    _mm512_store_ps(acc + (t * 8 + 2 * u + 1) * 16, o[t]);
  }
}

using VnniSweepFn = void (*)(const uint16_t*, const char*&, size_t, size_t, size_t, size_t,
                             const float*, size_t, float*);
constexpr VnniSweepFn kVnniSweeps[kMaxTokens + 1] = {nullptr,       sweep_vnni<1>, sweep_vnni<2>,
                                                     sweep_vnni<3>, sweep_vnni<4>, sweep_vnni<5>,
                                                     sweep_vnni<6>, sweep_vnni<7>, sweep_vnni<8>};

void rows_vnni(const PackedMatrix& w, const float* x, size_t n, float* y, size_t p0, size_t p1) {
  const size_t cols = w.cols, kpad = vnni::padded_cols(cols), pairs = cols / 2;
  const size_t grouped = pairs / 4 * 4;
  const uint16_t* base = w.data.data() + w.offset;
  thread_local avx2::Scratch acc_scratch;
  float* acc = acc_scratch.get(kMaxTokens * 8 * 16);
  for (size_t p = p0; p < p1; ++p) {
    const uint16_t* wp = base + p * kpad * kVnniRows;
    // Prefetched (past the matrix's end is harmless: prefetches do not fault).
    const uint16_t* next = wp + kpad * kVnniRows;
    const size_t r0 = p * kVnniRows, valid = std::min(kVnniRows, w.rows - r0);
    const __mmask16 mask = static_cast<__mmask16>(valid >= 16 ? 0xffffu : (1u << valid) - 1u);
    const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(mask, w.bias + r0) : _mm512_setzero_ps();
    for (size_t t0 = 0; t0 < n; t0 += kMaxTokens) {
      const size_t T = std::min(kMaxTokens, n - t0);
      const char* pf = reinterpret_cast<const char*>(next);
      for (size_t u = 0; u < 4; ++u)
        kVnniSweeps[T](wp, pf, u, grouped, pairs, cols, x + t0 * cols, cols, acc);
      for (size_t t = 0; t < T; ++t) {
        const float* a = acc + t * 8 * 16;
        const auto at = [&](int j) { return _mm512_load_ps(a + j * 16); };
        __m512 s =
            _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(at(0), at(1)), _mm512_add_ps(at(2), at(3))),
                          _mm512_add_ps(_mm512_add_ps(at(4), at(5)), _mm512_add_ps(at(6), at(7))));
        if (w.bias) s = _mm512_add_ps(s, bias);
        _mm512_mask_storeu_ps(y + (t0 + t) * w.rows + r0, mask, s);
      }
    }
  }
}

// ---- AVX2 panel layout ---------------------------------------------------------

void rows(const PackedMatrix& w, const float* x, size_t n, float* y, size_t p0, size_t p1) {
  const size_t cols = w.cols, body = cols / 4 * 4;
  const uint16_t* base = w.data.data() + w.offset;
  thread_local avx2::Scratch panel_scratch, acc_scratch;
  float* panel = panel_scratch.get(kKc * kRows);
  float* acc = acc_scratch.get(n * 64);
  for (size_t p = p0; p < p1; ++p) {
    const uint16_t* wp = base + p * cols * kRows;
    std::fill(acc, acc + n * 64, 0.0f);
    for (size_t k0 = 0; k0 < cols; k0 += kKc) {
      const size_t kc = std::min(kKc, cols - k0);
      const size_t grouped = body > k0 ? std::min(kc, body - k0) : 0;
      // The next block: this panel's next columns, else the next panel's first ones.
      const uint16_t* next = k0 + kc < cols ? wp + (k0 + kc) * kRows : wp + cols * kRows;
      convert(wp, k0, kc, next, panel);
      for (size_t t = 0; t < n; t += 4)
        kSweeps[std::min<size_t>(4, n - t)](panel, grouped, kc, x + t * cols + k0, cols,
                                            acc + t * 64);
    }
    const size_t r0 = p * kRows, valid = std::min(kRows, w.rows - r0);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 bias = w.bias ? _mm512_maskz_loadu_ps(mask, w.bias + r0) : _mm512_setzero_ps();
    for (size_t t = 0; t < n; ++t) {
      const float* at = acc + t * 64;
      __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(at), _mm512_load_ps(at + 16)),
                                 _mm512_add_ps(_mm512_load_ps(at + 32), _mm512_load_ps(at + 48)));
      if (w.bias) sum = _mm512_add_ps(sum, bias);
      _mm512_mask_storeu_ps(y + t * w.rows + r0, mask, sum);
    }
  }
}

}  // namespace

void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  if (n <= 1 || w.rows == 0 || w.cols == 0) return avx2::matmul(w, x, n, y, pool);
  const size_t panels = (w.rows + kRows - 1) / kRows;
  pool.parallel_chunks(panels, [&](size_t p0, size_t p1) { rows(w, x, n, y, p0, p1); });
}

void matmul_rows_vnni(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  if (n <= 1 || w.rows == 0 || w.cols == 0) {  // the GEMV itself, once per token
    for (size_t t = 0; t < n; ++t)
      avx512::matmul(w, x + t * w.cols, 1, y + t * w.rows, pool, GemmPrecision::fp32);
    return;
  }
  pool.parallel_chunks(vnni::panels(w.rows),
                       [&](size_t p0, size_t p1) { rows_vnni(w, x, n, y, p0, p1); });
}

}  // namespace edgellm::kernels::avx512
