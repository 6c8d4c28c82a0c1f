#include <algorithm>
#include <cmath>
#include <numeric>

#include "edgellm/session.h"
#include "kernels/kernels.h"

namespace edgellm {

namespace {
// splitmix64: small, fast, and reproducible across platforms for a given seed.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

Sampler::Sampler(const SamplerOptions& options) : options_(options), state_(options.seed) {}

int32_t Sampler::sample(std::span<const float> logits) {
  int32_t best = 0;
  if (options_.temperature <= 0.0f) {
    kernels::top_k(logits.data(), logits.size(), 1, &best);
    return best;
  }
  const size_t k =
      options_.top_k > 0 ? std::min<size_t>(options_.top_k, logits.size()) : logits.size();
  order_.resize(k);
  kernels::top_k(logits.data(), logits.size(), k, order_.data());
  std::vector<double> probs(k);
  const double max_logit = logits[order_[0]];
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i)
    sum += probs[i] = std::exp((logits[order_[i]] - max_logit) / options_.temperature);
  // top-p keeps the smallest prefix whose probability mass reaches p.
  size_t keep = k;
  if (options_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < k; ++i) {
      mass += probs[i] / sum;
      if (mass >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  // min-p (after the temperature, as HF's MinPLogitsWarper): probs[0] is the top
  // token's, exactly 1, so the cut-off is min_p itself.
  if (options_.min_p > 0.0f) {
    size_t above = 1;
    while (above < keep && probs[above] >= options_.min_p) ++above;
    keep = above;
  }
  const double total =
      std::accumulate(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double r = static_cast<double>(next_random(state_) >> 11) * 0x1.0p-53 * total;
  for (size_t i = 0; i < keep; ++i) {
    if ((r -= probs[i]) < 0) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace edgellm
