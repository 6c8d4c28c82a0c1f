// The machine's limits, measured in the same run as the numbers they judge:
// read bandwidth (decode is bandwidth-bound) and FMA peak (prefill GEMMs).
#pragma once

namespace edgellm {

struct Roofline {
  double read_gb_per_s = 0;    // streaming read of a buffer far larger than the caches
  double fma_gflop_per_s = 0;  // dependent-chain-free FMA loop on every thread
};

Roofline measure_roofline(int threads);

}  // namespace edgellm
