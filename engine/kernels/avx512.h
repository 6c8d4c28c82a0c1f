// Entry points of the AVX-512 (F/BW/VL/BF16) and AMX kernels (files
// *_avx512.cpp and *_amx.cpp, each compiled with its own flags). Declarations
// only, so portable code (dispatch.cpp, the tests) may include it; call the
// avx512 functions only when detect_isa() >= Isa::avx512, the amx ones only
// when detect_isa() == Isa::amx.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace edgellm::kernels {

// The shared avx512/amx matmul layout ("VNNI pairs"): rows in panels of 16;
// columns padded with zeros to a multiple of kKBlock. A panel is stored as
// kpad/2 column pairs; pair q holds, for each of the panel's 16 rows j, the
// two bf16 W[j][2q], W[j][2q+1] (64 bytes per pair). That is at once
//   - an AMX TDPBF16PS B tile (16 pair-rows x 64 bytes) per kKBlock columns,
//   - the vdpbf16ps operand for 16 rows x one pair of columns, and
//   - for the fp32 GEMV, two fp32 vectors per 64-byte load (shift / mask),
// so one copy of the weights serves decode (n == 1) and prefill (n > 1).
namespace vnni {
inline constexpr size_t kPanelRows = 16;
inline constexpr size_t kKBlock = 32;  // bf16 per AMX tile row
inline size_t padded_cols(size_t cols) {
  return (cols + kKBlock - 1) / kKBlock * kKBlock;
}
inline size_t panels(size_t rows) {
  return (rows + kPanelRows - 1) / kPanelRows;
}
void pack(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa, PackedMatrix& out);
void unpack_row(const PackedMatrix& w, size_t r, float* out);
}  // namespace vnni

namespace avx512 {
// Element-wise kernels (elementwise_avx512.cpp), the avx2 formulas in 16 lanes.
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);
void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);
void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out);
void add(float* acc, const float* x, size_t n);
// n == 1: fp32 GEMV; n > 1: vdpbf16ps GEMM on x rounded to bf16 at precision
// bf16, else an fp32 FMA GEMM (fp32, and bf16x2, which only amx splits).
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            GemmPrecision precision);
// This thread's buffer for bf16 rows: grows to the largest request, 64-byte
// aligned, valid until the thread's next call.
uint16_t* bf16_scratch(size_t count);
// Splits x into `parts` (1..3) bf16 planes, n_pad x cols_pad each, planes
// n_pad * cols_pad apart, rows cols_pad apart: plane 0 = bf16(x), plane p =
// bf16(x - planes 0..p-1), each rounded to nearest even. Three planes hold
// every fp32 x exactly (3 x 8 significant bits; parts below bf16's normal
// range, |x| < ~2^-110, read as zero on AMX), two keep ~16 bits. Columns
// [cols, cols_pad) and rows [n, n_pad) are zeros. Split over the pool.
// Fault::bf16_truncate truncates the parts (here and in to_bf16_tiles).
void to_bf16_parts(const float* x, size_t n, size_t cols, size_t n_pad, size_t cols_pad,
                   size_t parts, uint16_t* out, ThreadPool& pool);
// The same split of tokens [0, n_pad) and columns [c0, c0 + 32 * steps) of x
// (rows `cols` floats apart; tokens >= n and columns >= cols read as zero),
// laid out as AMX A tiles (16 tokens x 32 bf16, 1 KiB) in the order the AMX
// GEMM reads them: per 32-token block, per 32 columns, per part, the block's
// two 16-token tiles; element (t, c0 + c) of part p at
//   (((t / 32 * steps + c / 32) * parts + p) * 2 + t % 32 / 16) * 512
//   + t % 16 * 32 + c % 32.
// n_pad is a multiple of 32 and out 64-byte aligned. One thread: the AMX
// GEMM converts each worker's token block into its own cache.
void to_bf16_tiles(const float* x, size_t n, size_t cols, size_t n_pad, size_t c0, size_t steps,
                   size_t parts, uint16_t* out);
// Rows [0, rows) of a q8_0 KV cache (row i: int8 at q + i * hd, half scales at
// scales + i * hd / 32; hd % 32 == 0) widened to fp32 at out + i * out_stride:
// q times its scale, exact (kv_q8_0_avx512.cpp).
struct Q8Dequant {
  size_t prefetch_ahead = 0;     // > 0: request the lines this many bytes ahead (into L2)
  bool neighbour_scale = false;  // Fault::kv_scale_wrong_block
};
void dequantize_q8_0(const int8_t* q, const uint16_t* scales, size_t rows, size_t hd, float* out,
                     size_t out_stride, const Q8Dequant& opt = {});
// Prefill attention (flash style, keys in lanes via a transposed K block);
// needs head_dim % 16 == 0 and at most kMaxGroup query heads per kv head.
inline constexpr size_t kMinPrefillTokens = 16;
inline constexpr size_t kMaxGroup = 256;
void attention_prefill(const AttentionArgs& args, ThreadPool& pool);
// Prefill attention at AttnPrecision::bf16 (attention_bf16_avx512.cpp): q, K,
// V and P rounded to bf16 once, vdpbf16ps products, fp32 online softmax over
// kSoftmaxBlock-key blocks (ref::attention_bf16 is its reference). Needs
// n >= kMinPrefillTokens, head_dim % 32 == 0, at most kMaxBf16Group query
// heads per kv head, a K/V cache of fp32 or bf16.
inline constexpr size_t kMaxBf16Group = 48;
void attention_prefill_bf16(const AttentionArgs& args, ThreadPool& pool);
// Decode attention (n < kMinPrefillTokens; keys split across threads at long
// context); needs head_dim % 16 == 0.
void attention_decode(const AttentionArgs& args, ThreadPool& pool);
}  // namespace avx512

namespace amx {
// Below this many tokens the 16-row A tiles are mostly padding: use avx512.
inline constexpr size_t kMinTokens = 16;
// n >= kMinTokens: TDPBF16PS GEMM over the VNNI layout on x split into
// amx_parts(precision) bf16 parts (fp32: 3, exact; bf16x2: 2; bf16: 1), fp32
// accumulation; fewer tokens run avx512::matmul.
inline size_t amx_parts(GemmPrecision p) {
  return p == GemmPrecision::fp32 ? 3 : p == GemmPrecision::bf16x2 ? 2 : 1;
}
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            GemmPrecision precision);
// Prefill attention with both products on tiles (attention_amx.cpp), operands
// in bf16 parts: 3 at AttnPrecision::fp32 (exact), 1 at bf16; n >= avx512::kMinPrefillTokens,
// head_dim % 32 == 0, at most kMaxAttentionGroup query heads per kv head.
inline constexpr size_t kMaxAttentionGroup = 32;
void attention_prefill(const AttentionArgs& args, ThreadPool& pool);
}  // namespace amx

}  // namespace edgellm::kernels
