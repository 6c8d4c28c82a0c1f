// AVX-512 batched decode over the AVX2 panel layout (matmul_rows_avx512.cpp):
// used by kernels::matmul_rows when the CPU and the OS support AVX-512F.
#pragma once

#include "kernels/kernels.h"

namespace edgellm::kernels::avx512 {

bool available();  // cpuid AVX512F with the OS saving ZMM state
void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);

}  // namespace edgellm::kernels::avx512
