// The q8_0 KV cache's quantizer (kernels.h): the forward pass writes each new
// key and value through it, the tests and benchmarks build their caches with
// it. Scalar: a token's K/V is a few hundred values per layer.
#include <algorithm>
#include <cmath>

#include "edgellm/bf16.h"
#include "kernels/kernels.h"

namespace edgellm::kernels {

void quantize_kv_q8_0(const float* x, size_t n, int8_t* q, uint16_t* scales) {
  constexpr uint16_t kNan = 0x7e00, kMaxHalf = 0x7bff;
  for (size_t b = 0; b < n / kKvQ8Block; ++b) {
    const float* xb = x + b * kKvQ8Block;
    int8_t* qb = q + b * kKvQ8Block;
    float amax = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < kKvQ8Block; ++i) {
      const float a = std::fabs(xb[i]);
      finite = finite && a <= 3.4028235e38f;  // false for NaN and inf
      amax = std::max(amax, a);
    }
    if (!finite) {
      scales[b] = kNan;
      std::fill(qb, qb + kKvQ8Block, int8_t{0});
      continue;
    }
    // 127 s is exact (7 x 11 significant bits): the bump makes |x| / s <= 127,
    // also when amax / 127 rounded to 0 (amax < 2^-25 * 127).
    uint16_t h = std::min(float_to_f16(amax / 127.0f), kMaxHalf);
    if (amax > 127.0f * f16_to_float(h) && h < kMaxHalf) ++h;
    scales[b] = h;
    const float s = f16_to_float(h);
    if (s == 0.0f) {  // an all-zero block
      std::fill(qb, qb + kKvQ8Block, int8_t{0});
      continue;
    }
    for (size_t i = 0; i < kKvQ8Block; ++i) {
      // x / s rounds once; x - v s is exact (v s has <= 19 bits and lies
      // within s of x), so the residual picks the nearest v for certain.
      long v = std::lrint(xb[i] / s);
      const float e = xb[i] - static_cast<float>(v) * s;
      if (e > 0.5f * s) ++v;
      if (e < -0.5f * s) --v;
      qb[i] = static_cast<int8_t>(std::clamp(v, -127L, 127L));
    }
  }
}

}  // namespace edgellm::kernels
