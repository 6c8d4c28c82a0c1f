// The machine's limits, measured in the same run as the numbers they judge:
// read bandwidth (decode is bandwidth-bound) and FMA peak (prefill GEMMs).
#pragma once

#include <cstddef>

namespace edgellm {

struct Roofline {
  double read_gb_per_s = 0;    // streaming read of a buffer far larger than the caches
  double fma_gflop_per_s = 0;  // dependent-chain-free FMA loop on every thread
};

Roofline measure_roofline(int threads);

// The two measurements, for tools that need other sizes (e.g. cache-resident reads).
double measure_read_bandwidth(size_t bytes, int threads);  // GB/s, best of 3
double measure_fma_peak(int threads);                      // GFLOP/s, 0 without AVX2+FMA

}  // namespace edgellm
