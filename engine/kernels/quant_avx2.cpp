// Quantized matmul rows, AVX2 (maddubs + madd): see quant_simd.h.
#define QUANT_NS avx2
#define QUANT_VNNI 0
#include "kernels/quant_simd.h"
