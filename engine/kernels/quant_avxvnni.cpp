// Quantized matmul rows, AVX2 + AVX-VNNI (vpdpbusd): see quant_simd.h.
#define QUANT_NS avxvnni
#define QUANT_VNNI 1
#include "kernels/quant_simd.h"
