// The machine's limits, measured in the same run as the numbers they judge:
// read bandwidth (decode is bandwidth-bound) and the active tier's GEMM peak
// (prefill).
#pragma once

#include <cstddef>
#include <string_view>

#include "edgellm/exec_config.h"

namespace edgellm {

struct Roofline {
  double read_gb_per_s = 0;  // streaming read of a buffer far larger than the caches
  // Peak of the prefill GEMM's own instruction on the active tier, every
  // thread: fp32 FMA (avx2; avx512 at fp32 precision), vdpbf16ps (avx512 at
  // bf16), TDPBF16PS (amx).
  double fma_gflop_per_s = 0;
  std::string_view peak_tier;  // isa_name() of that tier
  // Instruction passes per useful flop of the prefill GEMM: amx runs one
  // TDPBF16PS pass per bf16 part of x (3 at fp32), so its useful-flop ceiling
  // is fma_gflop_per_s / passes.
  double passes = 1;
};

// The ceilings of the prefill GEMM as `cfg` runs it (tier and precision).
Roofline measure_roofline(int threads, const kernels::ExecConfig& cfg);
Roofline measure_roofline(int threads);  // kernels::process_exec_config()

// The two measurements, for tools that need other sizes (e.g. cache-resident reads).
double measure_read_bandwidth(size_t bytes, int threads);  // GB/s, best of 3
double measure_fma_peak(int threads);                      // GFLOP/s, 0 without AVX2+FMA
// GFLOP/s of `isa`'s GEMM instruction at `precision` (see Roofline); isa must
// be <= detect_isa().
double measure_matmul_peak(int threads, kernels::Isa isa, kernels::GemmPrecision precision);

}  // namespace edgellm
