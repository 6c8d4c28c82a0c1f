// Prefill GEMM on AMX-BF16 tiles over the VNNI-pair layout (kernels/avx512.h):
// y[t][r] = sum_c x[t][c] W[r][c] (+ bias[r]), fp32 accumulation.
//
// W is bf16 already; x is split into P bf16 parts (avx512::to_bf16_tiles):
// P = 3 holds fp32 x exactly (x = hi + mid + lo), so W x = W hi + W mid + W lo
// with every product exact in fp32 and only the fp32 sums rounded, the same
// class of error as an fp32 FMA GEMM. P = 2 keeps ~16 bits of x, P = 1 is the
// plain bf16 GEMM.
//
// Each step takes a 32-token x 32-row block of y in four C tiles (tmm0..3):
// per 32 columns it loads the two B tiles once (one per 16-row panel: 16
// column pairs x 16 rows, 64 contiguous bytes per pair, tmm6..7), then per
// part two A tiles (16 tokens x 32 bf16 each, tmm4..5) and issues four
// TDPBF16PS: 4P per 2 + 2P tile loads. P = 3 spends 3 TDPs per useful one,
// so fp32 tops out at 33% of the tile peak in useful flops.
//
// Where the time went (SmolLM2 / Llama-3.2-1B shapes, kernel_bench --gemm):
//   - x's parts are written in tile order (each A tile 1 KiB contiguous, in
//     the order the steps read them), per worker and per token block into that
//     worker's own buffer, so they are converted into and read from its L2. The
//     earlier whole-matrix planes (rows kpad apart, written by both threads,
//     then read 16 strided rows per tile) cost a quarter of the down
//     projection in the conversion alone.
//   - Threads split the tokens once each has >= 2 blocks of 32 (fewer: the
//     panels, each worker converting all of x): no x crosses cores.
//   - K in slices of <= 512 columns, C stored to y and reloaded between
//     slices, so a token block's x stays in L2 at K = 2048 / 8192 (B used to
//     be re-streamed from memory every 32 tokens there).
//   - Panel pairs in groups of ~256 KiB of B, each group swept over every
//     32-token block of the token block (B from L2; y's rows written in
//     runs of the group's width).
//   - No bias: C starts from TILEZERO rather than a stride-0 load.
// Measured and dropped: software prefetch of the next group's B (slower),
// streaming stores of C (slower). What is left: per 32 x 32 block the C
// load / store drains the tile pipeline (~20% at K = 576, a one-thread loop
// measured it), y's lines (4 bytes per output) go to L3, and x's conversion.
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
#include "kernels/fault_injection.h"

namespace edgellm::kernels::amx {

namespace {

using vnni::kKBlock;
using vnni::kPanelRows;

constexpr size_t kTile = 512;        // bf16 in one A or B tile (16 x 64 bytes)
constexpr size_t kBlockTokens = 32;  // tokens of a C block (two A tiles)
// K slice: C goes back to y between slices, so the x tiles of a token block
// stay in L2 however long the rows are (measured on Llama's K = 2048 / 8192:
// 512 beat 256, 1024 and no slicing). Rows of up to kWholeCols stay whole:
// splitting SmolLM2's 576 in two cost gate_up ~15% at 116 tokens (a C round
// trip per block for nothing: such an x block fits L2 anyway).
constexpr size_t kSliceCols = 512;
constexpr size_t kWholeCols = 640;
// A worker's x tiles per token block: half of a 2 MiB L2, the rest for the
// group of B panels and y's lines.
constexpr size_t kBlockBytes = 1024 * 1024;
// B panels swept over one token block at a time (its tiles stay in L2).
constexpr size_t kGroupBytes = 256 * 1024;
// Threads split the tokens when each gets at least this many 32-token blocks.
constexpr size_t kMinBlocksPerThread = 2;

// One 32-token x 32-row C block over `steps` k-steps of 32 columns, summed
// over P parts: `a` points at the block's tiles for the first step (2P tiles
// per step, avx512::to_bf16_tiles), b0 / b1 at the two panels' B tiles for it
// (one tile per step). C starts from `in` (rows `ld_in` floats apart; 0 loads
// the bias row into every row; null: zeros) and goes to `out` (rows `ld_out`
// apart).
// `b1` may equal `b0` when the second panel does not exist (its C is dropped).
template <class Tiles, int P>
void block_32x32(Tiles tiles, const uint16_t* a, const uint16_t* b0, const uint16_t* b1,
                 size_t steps, const float* in, size_t ld_in, float* out, size_t ld_out) {
  if (in) {
    tile_load<0>(tiles, in, ld_in * sizeof(float));
    tile_load<1>(tiles, in + 16, ld_in * sizeof(float));
    tile_load<2>(tiles, in + 16 * ld_in, ld_in * sizeof(float));
    tile_load<3>(tiles, in + 16 * ld_in + 16, ld_in * sizeof(float));
  } else {  // no bias: zeroing needs no memory
    tile_zero<0>(tiles);
    tile_zero<1>(tiles);
    tile_zero<2>(tiles);
    tile_zero<3>(tiles);
  }
  for (size_t s = 0; s < steps; ++s) {
    tile_load<6>(tiles, b0 + s * kTile, 64);
    tile_load<7>(tiles, b1 + s * kTile, 64);
    const uint16_t* as = a + s * 2 * P * kTile;
#pragma GCC unroll 3
    for (int p = 0; p < P; ++p) {
      tile_load<4>(tiles, as + 2 * p * kTile, 64);
      tile_load<5>(tiles, as + (2 * p + 1) * kTile, 64);
      tile_dpbf16ps<0, 4, 6>(tiles);
      tile_dpbf16ps<1, 4, 7>(tiles);
      tile_dpbf16ps<2, 5, 6>(tiles);
      tile_dpbf16ps<3, 5, 7>(tiles);
    }
  }
  tile_store<0>(tiles, out, ld_out * sizeof(float));
  tile_store<1>(tiles, out + 16, ld_out * sizeof(float));
  tile_store<2>(tiles, out + 16 * ld_out, ld_out * sizeof(float));
  tile_store<3>(tiles, out + 16 * ld_out + 16, ld_out * sizeof(float));
}

// Tokens [t_begin, t_end) x panels [p0, p1) (p0 even; t_begin a multiple of
// 32, t_end <= n_pad): per token block and K slice, converts x into this
// thread's tile buffer (it stays in L2), then sweeps groups of panel pairs
// over it, each group's B tiles reused from L2 by every 32-token block.
// bias_pad holds panels * 16 + 16 floats.
template <class Tiles, int P>
void gemm_block(Tiles tiles, const PackedMatrix& w, const float* x, size_t n, const float* bias_pad,
                float* y, size_t t_begin, size_t t_end, size_t p0, size_t p1) {
  static const TileConfig cfg = uniform_tile_config();
  tile_config(tiles, &cfg);
  const size_t kpad = vnni::padded_cols(w.cols), rows = w.rows, steps = kpad / kKBlock;
  const size_t pstride = kpad * kPanelRows;
  const uint16_t* base = w.data.data() + w.offset;
  // K in equal slices of <= kSliceCols: C goes back to y between slices, so
  // a token block's x slice stays in L2 however long the rows are. Not when
  // this thread's whole x fits its block budget already (short prompts).
  const bool whole =
      kpad <= kWholeCols || (t_end - t_begin) * P * kpad * sizeof(uint16_t) <= kBlockBytes;
  const size_t n_slices = whole ? 1 : (kpad + kSliceCols - 1) / kSliceCols;
  const size_t slice = (steps + n_slices - 1) / n_slices;
  const size_t block = std::max<size_t>(
      kBlockTokens, kBlockBytes / (P * slice * kKBlock * 2) / kBlockTokens * kBlockTokens);
  const size_t group = std::max<size_t>(1, kGroupBytes / (2 * kPanelRows * slice * kKBlock * 2));
  uint16_t* xt = avx512::bf16_scratch(P * block * slice * kKBlock);
  const bool drop_tail = fault::active() == fault::Fault::drop_k_tail;
  // Blocks cut by the last token or the last row live in `partial` between
  // slices: slot (p - p0) / 2 for the last token block, else pairs + t / 32.
  const size_t pairs = (p1 - p0 + 1) / 2;
  thread_local std::vector<float> partial;
  const size_t slots = pairs + block / kBlockTokens;
  if (partial.size() < slots * 1024) partial.resize(slots * 1024);
  for (size_t t0 = t_begin; t0 < t_end; t0 += block) {
    const size_t t1 = std::min(t_end, t0 + block);
    for (size_t s0 = 0; s0 < steps; s0 += slice) {
      const size_t ns = std::min(slice, steps - s0);
      const bool first = s0 == 0, last = s0 + ns == steps;
      avx512::to_bf16_tiles(x + t0 * w.cols, n > t0 ? n - t0 : 0, w.cols, t1 - t0, s0 * kKBlock, ns,
                            P, xt);
      // Fault::drop_k_tail leaves the last K step (32 columns) out of the sum.
      const size_t used = last && drop_tail ? ns - 1 : ns;
      for (size_t g0 = p0; g0 < p1; g0 += 2 * group) {
        const size_t g1 = std::min(p1, g0 + 2 * group);
        for (size_t t = t0; t < t1; t += kBlockTokens) {
          const uint16_t* a = xt + (t - t0) / kBlockTokens * ns * 2 * P * kTile;
          const size_t valid_tokens = std::min(kBlockTokens, n - t);
          for (size_t p = g0; p < g1; p += 2) {
            const uint16_t* b0 = base + p * pstride + s0 * kTile;
            const uint16_t* b1 = p + 1 < p1 ? b0 + pstride : b0;
            const size_t r0 = p * kPanelRows;
            const size_t valid_rows = std::min<size_t>(p + 1 < p1 ? 32 : 16, rows - r0);
            if (valid_tokens == 32 && valid_rows == 32) {
              float* c = y + t * rows + r0;
              block_32x32<Tiles, P>(tiles, a, b0, b1, used,
                                    first ? (bias_pad ? bias_pad + r0 : nullptr) : c,
                                    first ? 0 : rows, c, rows);
              continue;
            }
            const size_t slot = valid_tokens < 32 ? (p - p0) / 2 : pairs + (t - t0) / kBlockTokens;
            float* c = partial.data() + slot * 1024;
            block_32x32<Tiles, P>(tiles, a, b0, b1, used,
                                  first ? (bias_pad ? bias_pad + r0 : nullptr) : c, first ? 0 : 32,
                                  c, 32);
            if (!last) continue;
            for (size_t i = 0; i < valid_tokens; ++i)
              std::memcpy(y + (t + i) * rows + r0, c + i * 32, valid_rows * sizeof(float));
          }
        }
      }
    }
  }
  tile_release(tiles);
}

}  // namespace

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            GemmPrecision precision) {
  const size_t kpad = vnni::padded_cols(w.cols);
  if (n < kMinTokens || kpad == 0 || w.rows == 0)
    return avx512::matmul(w, x, n, y, pool, precision);
  const size_t parts = amx_parts(precision);
  const size_t n_blocks = (n + kBlockTokens - 1) / kBlockTokens, n_pad = n_blocks * kBlockTokens;
  const size_t panels = vnni::panels(w.rows);
  // The bias over whole panels plus one spare panel (a lone last panel's
  // block reads 32 rows), zeros past the matrix.
  thread_local std::vector<float> bias_pad;
  bias_pad.assign((panels + 1) * kPanelRows, 0.0f);
  if (w.bias) std::copy(w.bias.get(), w.bias.get() + w.rows, bias_pad.begin());
  // This thread's buffer, read by the workers; none without a bias.
  const float* bias = w.bias ? bias_pad.data() : nullptr;
  const auto run = [&](size_t t_begin, size_t t_end, size_t p0, size_t p1) {
    with_tiles([&](auto tiles) {
      using Tiles = decltype(tiles);
      const auto block = parts == 3   ? gemm_block<Tiles, 3>
                         : parts == 2 ? gemm_block<Tiles, 2>
                                      : gemm_block<Tiles, 1>;
      block(tiles, w, x, n, bias, y, t_begin, t_end, p0, p1);
    });
  };
  // Threads split the tokens (each converts its own x into its own L2) when
  // each gets a few 32-token blocks; else the panels, each converting all x.
  if (n_blocks >= kMinBlocksPerThread * static_cast<size_t>(pool.size())) {
    pool.parallel_chunks(n_blocks, [&](size_t b0, size_t b1) {
      run(b0 * kBlockTokens, b1 * kBlockTokens, 0, panels);
    });
  } else {
    pool.parallel_chunks((panels + 1) / 2, [&](size_t q0, size_t q1) {
      run(0, n_pad, 2 * q0, std::min(panels, 2 * q1));
    });
  }
}

}  // namespace edgellm::kernels::amx
