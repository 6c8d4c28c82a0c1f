// Entry points of the AVX2+FMA+F16C kernels (files *_avx2.cpp, compiled with
// -mavx2 -mfma -mf16c). This header holds only declarations, so portable code
// (dispatch.cpp, the tests) may include it; call these only when
// detect_isa() reports Isa::avx2.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace edgellm::kernels::avx2 {

// Matmul layout for AVX2 (see matmul_avx2.cpp): rows in panels of kPanelRows,
// each panel stored column-major (k-major): for every column c, the panel's
// 16 bf16 weights W[p*16 .. p*16+15][c] are 32 contiguous bytes, ordered
// (row 0, row 8, row 1, row 9, ...) so that a shift and a mask turn them into
// two fp32 vectors (rows 0..7 and rows 8..15) without a shuffle.
inline constexpr size_t kPanelRows = 16;
void pack(const uint16_t* bf16_row_major, size_t rows, size_t cols, PackedMatrix& out);
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
// Row r of a matrix packed by pack(), as fp32 (tied embeddings, tests).
void unpack_row(const PackedMatrix& w, size_t r, float* out);

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);
void rope(float* x, size_t n_heads, size_t head_dim, size_t rotary_dim, const float* cos,
          const float* sin);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);
void swiglu_oai_mul(const float* gate, const float* up, size_t n, float limit, float* out);
void add(float* acc, const float* x, size_t n);
void attention(const AttentionArgs& args, ThreadPool& pool);  // head_dim % 8 == 0
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);

// The vector math behind the activations and softmax, exposed so the tests
// can hold them to std::exp / std::tanh element by element.
void exp_array(const float* x, size_t n, float* out);
void tanh_array(const float* x, size_t n, float* out);

}  // namespace edgellm::kernels::avx2
