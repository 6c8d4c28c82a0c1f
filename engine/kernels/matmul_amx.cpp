// Prefill GEMM on AMX-BF16 tiles over the VNNI-pair layout (kernels/avx512.h):
// y[t][r] = sum_c x[t][c] W[r][c] (+ bias[r]), fp32 accumulation.
//
// W is bf16 already; x is split into P bf16 parts (avx512::to_bf16_parts):
// P = 3 holds fp32 x exactly (x = hi + mid + lo), so W x = W hi + W mid + W lo
// with every product exact in fp32 and only the fp32 sums rounded, the same
// class of error as an fp32 FMA GEMM. P = 2 keeps ~16 bits of x, P = 1 is the
// plain bf16 GEMM. The parts are planes of rows of kpad columns, the token
// count padded to a multiple of 32 with zero rows.
//
// Each step takes a 32-token x 32-row block of y in four C tiles (tmm0..3):
// per 32 columns it loads the two B tiles once (one per 16-row panel: 16
// column pairs x 16 rows, 64 contiguous bytes per pair, tmm6..7), then per
// part two A tiles (16 tokens x 32 bf16 each, tmm4..5) and issues four
// TDPBF16PS: 4P per 2 + 2P tile loads. Threads split over pairs of panels; a
// token block's x parts (<= 512 KiB) stay in L2 while the thread's panels
// sweep it.
//
// Linux grants the tile state per process (arch_prctl in cpu_features.cpp,
// before Isa::amx can be chosen). Each worker loads the tile configuration at
// the start of its share and releases it at the end.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/avx512.h"

namespace edgellm::kernels::amx {

namespace {

using vnni::kKBlock;
using vnni::kPanelRows;

constexpr size_t kTokenTile = 16;  // rows of an A / C tile
constexpr size_t kBlockBytes = 512 * 1024;

TileConfig make_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {  // all eight tiles: 16 rows x 64 bytes
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

// One 32-token x 32-row block of y, summed over P parts of A (planes `plane`
// elements apart), starting from the bias: `bias` holds the block's 32 rows
// (zeros past the matrix, or all zeros without a bias), loaded with stride 0
// so each of a tile's 16 rows starts from it. The block goes straight to y
// (rows `ldy` floats apart) when it is whole, else through `c` (32 x 32).
// `b1` may equal `b0` when the second panel does not exist (its C is dropped).
template <int P>
void block_32x32(const uint16_t* a, size_t lda_bytes, size_t plane, const uint16_t* b0,
                 const uint16_t* b1, size_t kpad, const float* bias, float* y, size_t ldy,
                 size_t valid_tokens, size_t valid_rows, float* c) {
  _tile_loadd(0, bias, 0);
  _tile_loadd(1, bias + 16, 0);
  _tile_loadd(2, bias, 0);
  _tile_loadd(3, bias + 16, 0);
  const size_t a_lower = kTokenTile * lda_bytes / sizeof(uint16_t);
  for (size_t k = 0; k < kpad; k += kKBlock) {
    // B tile for columns [k, k + 32): pairs k/2 .. k/2 + 15, 64 bytes each.
    const size_t b_off = (k / 2) * 2 * kPanelRows;
    _tile_loadd(6, b0 + b_off, 64);
    _tile_loadd(7, b1 + b_off, 64);
#pragma GCC unroll 3
    for (int p = 0; p < P; ++p) {
      const uint16_t* ap = a + p * plane + k;
      _tile_loadd(4, ap, lda_bytes);
      _tile_loadd(5, ap + a_lower, lda_bytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  const bool whole = valid_tokens == 32 && valid_rows == 32;
  float* out = whole ? y : c;
  const size_t ld = whole ? ldy : 32;
  _tile_stored(0, out, ld * sizeof(float));
  _tile_stored(1, out + 16, ld * sizeof(float));
  _tile_stored(2, out + 16 * ld, ld * sizeof(float));
  _tile_stored(3, out + 16 * ld + 16, ld * sizeof(float));
  if (whole) return;
  for (size_t i = 0; i < valid_tokens; ++i)
    std::memcpy(y + i * ldy, c + i * 32, valid_rows * sizeof(float));
}

// Panels [p0, p1) for every token; xb holds P planes of n_pad (multiple of 32)
// bf16 rows; bias_pad holds panels * 16 floats.
template <int P>
void gemm_panels(const PackedMatrix& w, const uint16_t* xb, size_t n, size_t n_pad,
                 const float* bias_pad, float* y, size_t p0, size_t p1) {
  static const TileConfig cfg = make_config();
  _tile_loadconfig(&cfg);
  const size_t kpad = vnni::padded_cols(w.cols), rows = w.rows;
  const size_t pstride = kpad * kPanelRows, plane = n_pad * kpad;
  const uint16_t* base = w.data.data() + w.offset;
  const size_t block = std::max<size_t>(32, kBlockBytes / (P * kpad * 2) / 32 * 32);
  alignas(64) float c[32 * 32];
  for (size_t t0 = 0; t0 < n; t0 += block) {
    const size_t t1 = std::min(n_pad, t0 + block);
    for (size_t p = p0; p < p1; p += 2) {
      const uint16_t* b0 = base + p * pstride;
      const uint16_t* b1 = p + 1 < p1 ? b0 + pstride : b0;
      const size_t r0 = p * kPanelRows;
      const size_t valid_rows = std::min<size_t>(p + 1 < p1 ? 32 : 16, rows - r0);
      for (size_t t = t0; t < std::min(t1, n); t += 32) {
        block_32x32<P>(xb + t * kpad, kpad * sizeof(uint16_t), plane, b0, b1, kpad, bias_pad + r0,
                       y + t * rows + r0, rows, std::min<size_t>(32, n - t), valid_rows, c);
      }
    }
  }
  _tile_release();
}

}  // namespace

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  const size_t kpad = vnni::padded_cols(w.cols);
  if (n < kMinTokens || kpad == 0 || w.rows == 0) return avx512::matmul(w, x, n, y, pool);
  const size_t parts = amx_parts(gemm_precision());
  const size_t n_pad = (n + 31) / 32 * 32;
  const size_t panels = vnni::panels(w.rows);
  uint16_t* xb = avx512::bf16_scratch(parts * n_pad * kpad);
  avx512::to_bf16_parts(x, n, w.cols, n_pad, kpad, parts, xb, pool);
  // The bias over whole panels plus one spare panel (a lone last panel's
  // block reads 32 rows), zeros past the matrix.
  thread_local std::vector<float> bias_pad;
  bias_pad.assign((panels + 1) * kPanelRows, 0.0f);
  if (w.bias) std::copy(w.bias, w.bias + w.rows, bias_pad.begin());
  const float* bias = bias_pad.data();  // this thread's buffer, read by the workers
  const auto run = parts == 3 ? gemm_panels<3> : parts == 2 ? gemm_panels<2> : gemm_panels<1>;
  pool.parallel_chunks((panels + 1) / 2, [&](size_t q0, size_t q1) {
    run(w, xb, n, n_pad, bias, y, 2 * q0, std::min(panels, 2 * q1));
  });
}

}  // namespace edgellm::kernels::amx
