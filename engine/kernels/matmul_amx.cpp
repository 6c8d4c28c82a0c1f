// Prefill GEMM on AMX-BF16 tiles over the VNNI-pair layout (kernels/avx512.h):
// y[t][r] = sum_c bf16(x[t][c]) W[r][c] (+ bias[r]), fp32 accumulation.
//
// x is rounded to bf16 once into row-major rows of kpad columns, its token
// count padded to a multiple of 32 with zero rows. Each step takes a 32-token
// x 32-row block of y in four C tiles (tmm0..3): per 32 columns it loads two
// A tiles (16 tokens x 32 bf16 each, tmm4..5) and two B tiles (one per 16-row
// panel: 16 column pairs x 16 rows, 64 contiguous bytes per pair, tmm6..7)
// and issues four TDPBF16PS. Threads split over pairs of panels; a token
// block's x (<= 512 KiB) stays in L2 while the thread's panels sweep it.
//
// Linux grants the tile state per process (arch_prctl in cpu_features.cpp,
// before Isa::amx can be chosen). Each worker loads the tile configuration at
// the start of its share and releases it at the end.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/avx512.h"

namespace edgellm::kernels::amx {

namespace {

using vnni::kKBlock;
using vnni::kPanelRows;

constexpr size_t kTokenTile = 16;  // rows of an A / C tile
constexpr size_t kBlockBytes = 512 * 1024;

// The LDTILECFG memory operand (64 bytes), palette 1.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

TileConfig make_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {  // all eight tiles: 16 rows x 64 bytes
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}

// One 32-token x 32-row block of C into `c` (32 x 32 fp32, row-major).
// `b1` may equal `b0` when the second panel does not exist (its C is dropped).
void block_32x32(const uint16_t* a, size_t lda_bytes, const uint16_t* b0, const uint16_t* b1,
                 size_t kpad, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const size_t a_lower = kTokenTile * lda_bytes / sizeof(uint16_t);
  for (size_t k = 0; k < kpad; k += kKBlock) {
    // B tile for columns [k, k + 32): pairs k/2 .. k/2 + 15, 64 bytes each.
    const size_t b_off = (k / 2) * 2 * kPanelRows;
    _tile_loadd(4, a + k, lda_bytes);
    _tile_loadd(5, a + a_lower + k, lda_bytes);
    _tile_loadd(6, b0 + b_off, 64);
    _tile_loadd(7, b1 + b_off, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr size_t ldc_bytes = 32 * sizeof(float);
  _tile_stored(0, c, ldc_bytes);
  _tile_stored(1, c + 16, ldc_bytes);
  _tile_stored(2, c + 16 * 32, ldc_bytes);
  _tile_stored(3, c + 16 * 32 + 16, ldc_bytes);
}

// Panels [p0, p1) for every token; xb holds n_pad (multiple of 32) bf16 rows.
void gemm_panels(const PackedMatrix& w, const uint16_t* xb, size_t n, size_t n_pad, float* y,
                 size_t p0, size_t p1) {
  static const TileConfig cfg = make_config();
  _tile_loadconfig(&cfg);
  const size_t kpad = vnni::padded_cols(w.cols), rows = w.rows;
  const size_t pstride = kpad * kPanelRows;
  const uint16_t* base = w.data.data() + w.offset;
  const size_t block = std::max<size_t>(32, kBlockBytes / (kpad * 2) / 32 * 32);
  alignas(64) float c[32 * 32];
  for (size_t t0 = 0; t0 < n_pad; t0 += block) {
    const size_t t1 = std::min(n_pad, t0 + block);
    for (size_t p = p0; p < p1; p += 2) {
      const uint16_t* b0 = base + p * pstride;
      const uint16_t* b1 = p + 1 < p1 ? b0 + pstride : b0;
      const size_t r0 = p * kPanelRows;
      const size_t valid_rows = std::min<size_t>(p + 1 < p1 ? 32 : 16, rows - r0);
      for (size_t t = t0; t < t1; t += 32) {
        block_32x32(xb + t * kpad, kpad * sizeof(uint16_t), b0, b1, kpad, c);
        const size_t valid_tokens = std::min<size_t>(32, n > t ? n - t : 0);
        for (size_t i = 0; i < valid_tokens; ++i) {
          float* yr = y + (t + i) * rows + r0;
          for (size_t j = 0; j < valid_rows; ++j)
            yr[j] = c[i * 32 + j] + (w.bias ? w.bias[r0 + j] : 0.0f);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  const size_t kpad = vnni::padded_cols(w.cols);
  if (n < kMinTokens || kpad == 0 || w.rows == 0 || gemm_precision() != GemmPrecision::bf16)
    return avx512::matmul(w, x, n, y, pool);
  const size_t n_pad = (n + 31) / 32 * 32;
  uint16_t* xb = avx512::bf16_scratch(n_pad * kpad);
  avx512::to_bf16_rows(x, n, w.cols, n_pad, kpad, xb, pool);
  const size_t panels = vnni::panels(w.rows);
  pool.parallel_chunks((panels + 1) / 2, [&](size_t q0, size_t q1) {
    gemm_panels(w, xb, n, n_pad, y, 2 * q0, std::min(panels, 2 * q1));
  });
}

}  // namespace edgellm::kernels::amx
