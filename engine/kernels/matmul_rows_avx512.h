// AVX-512 batched decode (matmul_rows_avx512.cpp), used by kernels::matmul_rows:
// over the AVX2 panel layout when the model's tier is avx512 or above, and over
// the VNNI-pair layout (avx512 / amx packing). Each output row is bit-identical
// to the n == 1 GEMV of the matrix's layout.
#pragma once

#include "kernels/kernels.h"

namespace edgellm::kernels::avx512 {

void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);
// w packed in the VNNI-pair layout (vnni::pack); call only when AVX-512 runs.
void matmul_rows_vnni(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);

}  // namespace edgellm::kernels::avx512
