// Quantized weight matrices: GGUF block formats kept exact, repacked at setup
// into four internal layouts the kernels stream.
//
//   i8  int8 values, one fp32 scale per `group` (32, or 16 for the K formats
//       with 16-element sub-blocks), optional fp32 min per group:
//       w = scale * q (+ min).   Q8_0, Q6_K (sc * d per 16),
//                                Q3_K (d * (sc - 32) per 16),
//                                Q5_K (min -dmin * m), Q2_K (per 16, min -dmin * m)
//   u4  4-bit values, fp32 scale per 32, optional fp32 min per 32:
//       w = scale * (q - zero) + min  Q4_0 (zero 8), Q4_1, Q4_K (min = -dmin * m)
//   u5  5-bit values, fp32 scale per 32, optional fp32 min per 32:
//       w = scale * (q - zero) + min  Q5_0 (zero 16), Q5_1
//   c4  4-bit codes into a 16-entry int8 codebook (one per segment), a scale
//       per 32 (fp32, half, or MXFP4's E8M0 byte): w = scale * codebook[q]
//                                IQ4_NL, IQ4_XS (d * (ls - 32) per 32: the
//                                codebook kvalues_iq4nl), MXFP4 (the doubled
//                                E2M1 values kvalues_mxfp4, scale the E8M0 half)
//
// All are exact: every scale and min is the fp32 value the GGUF's own
// dequantization computes (gguf-py quants.py, ggml-quants.c), so dequant_row()
// reproduces it bit for bit. A u4 block of 32 is 16 bytes, byte j holding
// element j (low nibble) and element j + 16 (high nibble), as in Q4_0 (and
// IQ4_NL, IQ4_XS and MXFP4's own nibbles: c4 keeps their codes as they are,
// streaming 17 (MXFP4), 18 (IQ4_NL) or 20 (IQ4_XS) bytes per 32 instead of an
// int8 copy's 34-36). A u5
// block is 20 bytes: the u4 block of the low four bits, then a little-endian
// uint32 whose bit j is element j's fifth bit (Q5_0's qs and qh, reordered),
// so Q5_0 streams its GGUF size (22 bytes per 32 with the half scale) instead
// of the 34 an int8 copy took.
//
// The matmul has two activation precisions (EDGELLM_QUANT_PRECISION):
//   fp32 (default): x stays fp32; the integers q are converted to fp32 in
//     registers and each block contributes scale * sum_j (q_j - zero) x_j
//     + min * sum_j x_j: the dequantized weights times x, up to fp32 rounding.
//     Under the fast GEMM precision (bf16) the avx512 and amx tiers round x to
//     bf16 once instead (the weights stay exact): prefill on every layout,
//     decode on u4, u5 and c4 (avx512::quant_matmul_bf16 / quant_gemv_bf16).
//   int8: x is quantized per block of 32 to int8 (scale = max|x| / 127) and
//     blocks take integer dot products (AVX-VNNI), as llama.cpp does: ~0.4%
//     relative rounding on x, which the gate measured at 20-40x HF bf16's
//     own noise floor on SmolLM2 (LESSONS.md), so it is opt-in.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "edgellm/thread_pool.h"
#include "kernels/kernels.h"

namespace edgellm::kernels {

// GGUF block formats with a kernel path (ggml names).
enum class BlockFormat {
  q4_0,
  q4_1,
  q5_0,
  q5_1,
  q8_0,
  q2_k,
  q3_k,
  q4_k,
  q5_k,
  q6_k,
  iq4_nl,
  iq4_xs,
  mxfp4
};
std::string_view block_format_name(BlockFormat f);
size_t block_elems(BlockFormat f);  // 32 or 256
size_t block_bytes(BlockFormat f);  // bytes of one GGUF block

enum class QuantLayout { i8, u4, u5, c4 };

// Bytes of one block of 32 weights: i8 32, u4 and c4 16, u5 16 + 4.
constexpr size_t layout_block_bytes(QuantLayout l) {
  return l == QuantLayout::i8 ? 32 : l == QuantLayout::u5 ? 20 : 16;
}
// Element j (0..31) of a u4, u5 or c4 block as its unsigned q (c4: the code),
// before the zero point or codebook (the scalar paths' unpack).
inline int packed_value(QuantLayout l, const uint8_t* blk, size_t j) {
  const int lo = j < 16 ? blk[j] & 0xf : blk[j - 16] >> 4;
  return l == QuantLayout::u5 ? lo | ((blk[16 + j / 8] >> (j % 8)) & 1) << 4 : lo;
}

// MXFP4's scale from its E8M0 byte e: half the power of two, 2^(e - 128), as
// fp32 bits (ggml GGML_E8M0_TO_FP32_HALF): e = 0 and 1 are the subnormals
// 2^-128 and 2^-127.
inline float e8m0_half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? uint32_t{0x00200000} << e : uint32_t{e - 1u} << 23);
}

// Rows of one layout; a QuantMatrix stacks segments (q, k and v may differ).
struct QuantSegment {
  QuantLayout layout = QuantLayout::i8;
  size_t rows = 0, cols = 0;
  size_t group = 32;  // elements per scale and min (i8: 32 or 16; u4, u5, c4: 32)
  int zero = 0;       // u4, u5 only
  bool has_min = false;
  std::array<int8_t, 16> codebook{};  // c4 only: code q -> its integer value
  std::vector<uint8_t> qs;            // rows * row_bytes(): blocks of layout_block_bytes()
  std::vector<float> scales;          // rows * cols / group
  std::vector<float> mins;            // rows * cols / group when has_min
  // When every scale and min is exactly an IEEE half (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
  // store them so) they are kept as halves instead: decode streams 2 bytes
  // less per block. Then `scales` and `mins` are empty.
  bool half_scales = false;
  std::vector<uint16_t> scales16, mins16;
  // MXFP4 keeps its E8M0 bytes (scale e8m0_half(e), exact for every byte it
  // takes): 1 byte per block, so c4 streams the GGUF's own 17 bytes per 32.
  // Then `scales` is empty (no mins).
  bool e8m0_scales = false;
  std::vector<uint8_t> scales8;

  size_t row_bytes() const { return cols / 32 * layout_block_bytes(layout); }
  // Mins per 16 (Q2_K) take the activations' sums per 16, the others per 32.
  bool mins_per_16() const { return has_min && group == 16; }
  float scale(size_t i) const;  // scales[i] whichever way it is stored
  float min(size_t i) const;
  size_t bytes() const;  // what one pass over the segment streams
  // Element j of a u4, u5 or c4 block as the integer its scale multiplies:
  // q - zero, or codebook[q].
  int value(const uint8_t* blk, size_t j) const {
    const int q = packed_value(layout, blk, j);
    return layout == QuantLayout::c4 ? codebook[q] : q - zero;
  }
};

struct QuantMatrix {
  size_t rows = 0, cols = 0;
  std::vector<QuantSegment> segments;
  size_t bytes() const;
};

// Repacks `rows` GGUF rows of `cols` elements (cols a multiple of the block)
// into a segment. Output row i is GGUF row row_order[i] (nullptr: identity).
// Blocks no exact fp32 layout holds (an MXFP4 exponent above kMaxMxfp4Exponent)
// are refused with an Error naming `tensor`.
QuantSegment repack_gguf(BlockFormat f, const uint8_t* blocks, size_t rows, size_t cols,
                         const int32_t* row_order = nullptr, std::string_view tensor = {});
// The largest MXFP4 E8M0 exponent byte repack_gguf takes: its half-scale 2^124
// times the largest code (12) is still finite in fp32. 253 and up overflow
// (255 is NaN in the OCP MX spec); ggml's quantizer of finite values writes at
// most 252 (floor(log2(max |x|)) - 2 + 127, max |x| < 2^128).
inline constexpr int kMaxMxfp4Exponent = 252;

// Quantizes fp32 rows (cols % 32 == 0) into GGUF blocks of q8_0 or q4_0, with
// ggml's reference rounding, then repacks them (--weights q8_0|q4_0).
QuantSegment quantize_rows(BlockFormat f, const float* x, size_t rows, size_t cols);
// The same rounding into GGUF blocks at `out` (rows * cols / 32 blocks), for
// callers that quantize a large matrix a few rows at a time.
void quantize_blocks(BlockFormat f, const float* x, size_t rows, size_t cols, uint8_t* out);

// What repack_gguf allocates for such a matrix (the memory check before setup):
// exact for the formats that store half scales (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
// an upper bound for the others (fp32 scales, which may shrink to halves).
size_t repacked_bytes(BlockFormat f, size_t rows, size_t cols);

// Appends a segment's rows below the matrix's (same cols).
void append_segment(QuantMatrix& m, QuantSegment s);

// Row r as fp32, bit-identical to the GGUF's dequantization (embedding lookup).
void dequant_row(const QuantMatrix& m, size_t r, float* out);

// The process default activation precision (kernels.h QuantPrecision) for
// callers that pass none (tests, benchmarks): fp32 unless set.
QuantPrecision quant_precision();
void set_quant_precision(QuantPrecision p);  // tests, benchmarks

// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < n, with x at precision
// `p` on the paths of tier `isa`.
void quant_matmul(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                  ThreadPool& pool, Isa isa, QuantPrecision p);
void quant_matmul(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                  ThreadPool& pool);  // active_isa(), quant_precision()
// Batched decode: the same y as n calls with n == 1 (bit for bit, per token),
// each weight tile read from memory once for all n tokens.
void quant_matmul_rows(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                       ThreadPool& pool, Isa isa, QuantPrecision p);

// Activations quantized per block of 32: the kernels' input.
struct QuantizedActs {
  size_t n = 0, cols = 0;
  std::vector<int8_t> q;           // [n][cols]
  std::vector<float> scale;        // [n][cols / 32]
  std::vector<float> sum;          // [n][cols / 32] fp32 sum of the block (for mins)
  std::vector<int32_t> qsum;       // [n][cols / 32] sum of q (for zero points)
  std::vector<float> scaled_qsum;  // [n][cols / 32] scale * qsum
  std::vector<float> half_sum;     // [n][cols / 16] fp32 sum of each half (for mins per 16)
};
void quantize_acts(const float* x, size_t n, size_t cols, QuantizedActs& out);

// Output rows [r0, r1) of one segment for all n tokens: y[t * ldy + r].
using QuantRowsFn = void (*)(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy,
                             size_t r0, size_t r1);

// fp32 activations: x [n][cols] and its per-block sums [n][cols / 32] (for
// zero points and mins, taken once per row instead of per element); sums per
// 16 [n][cols / 16] only where a segment has mins_per_16().
struct Fp32Acts {
  const float* x = nullptr;
  const float* block_sum = nullptr;
  size_t n = 0, cols = 0;
  const float* half_sum = nullptr;
  // Batched decode: each token's arithmetic is its own GEMV's (n == 1), bit for
  // bit, while a block is still unpacked once for several tokens.
  bool per_token = false;
};
// Sums of each `group` (32 or 16) consecutive values of x: out [n][cols / group].
void block_sums(const float* x, size_t n, size_t cols, float* out, size_t group = 32);

using QuantRowsFp32Fn = void (*)(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy,
                                 size_t r0, size_t r1);

namespace ref {
// Scalar fp32 reference: per block scale * sum (q - zero) x (+ min * sum x).
void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1);
// Scalar integer reference (the same integer sums as the SIMD paths).
void quant_rows(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r0,
                size_t r1);
}  // namespace ref

namespace avx2 {
void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1);
void quant_rows(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r0,
                size_t r1);
}  // namespace avx2

// 16 lanes; where the active ISA is avx512 or amx.
namespace avx512 {
void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1);
// Prefill with bf16 activations (quant_bf16_avx512.cpp): x rounded to bf16 once
// (nearest even), the weights exact, scales and mins in fp32; the fast config's
// quantized GEMM on the avx512 tier. The whole matrix, all n tokens, no bias.
inline constexpr size_t kMinBf16QuantTokens = 16;
void quant_matmul_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
// Decode with bf16 activations (quant_gemv_bf16_avx512.cpp), the fast config's
// quantized matmul below kMinBf16QuantTokens: u4, u5 and c4 segments (Q4_0,
// Q4_1, Q4_K, Q5_0, Q5_1; IQ4_NL, IQ4_XS, MXFP4) on x rounded to bf16 once
// (nearest even), their q - zero or codebook value exact in bf16, scales and
// mins in fp32; i8 segments on quant_rows_fp32 with fp32 x. Each
// token has its own GEMV's arithmetic, so any n is n single-token calls, bit
// for bit (batched decode). The whole matrix, no bias.
void quant_gemv_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
}  // namespace avx512

// Prefill on AMX-BF16 tiles (quant_amx.cpp) on the amx tier (the CPU's tiles
// or the tile model, kernels.h tile_backend()). The whole matrix, all n
// tokens, no bias. quant_matmul_fp32: fp32 activations as 3 exact bf16
// parts (quant_matmul takes it at n >= kMinQuantTokens at fp32 precision);
// quant_matmul_bf16: x rounded to bf16 once, one pass (the fast config, as
// avx512::quant_matmul_bf16 on the avx512 tier).
namespace amx {
inline constexpr size_t kMinQuantTokens = 16;
void quant_matmul_fp32(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
void quant_matmul_bf16(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
}  // namespace amx

// The AVX2 kernels with AVX-VNNI dot products; only where has_avx_vnni() (kernels.h).
namespace avxvnni {
void quant_rows(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r0,
                size_t r1);
}  // namespace avxvnni

}  // namespace edgellm::kernels
