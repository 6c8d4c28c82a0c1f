#include <algorithm>
#include <cmath>
#include <limits>
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

// log(sum(exp(logits))), shifted by the maximum so that nothing overflows.
double log_sum_exp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  return max_logit + std::log(sum);
}
}  // namespace

Sampler::Sampler(const SamplerOptions& options) : options_(options), state_(options.seed) {}

std::span<const float> Sampler::penalized(std::span<const float> logits) {
  if ((options_.frequency_penalty == 0.0f && options_.presence_penalty == 0.0f) || counts_.empty())
    return logits;
  adjusted_.assign(logits.begin(), logits.end());
  for (const auto& [token, count] : counts_) {
    if (static_cast<size_t>(token) >= adjusted_.size()) continue;
    adjusted_[static_cast<size_t>(token)] -=
        options_.frequency_penalty * static_cast<float>(count) + options_.presence_penalty;
  }
  return adjusted_;
}

std::vector<std::pair<int32_t, double>> Sampler::candidates(std::span<const float> raw) {
  const std::span<const float> logits = penalized(raw);
  int32_t best = 0;
  if (options_.temperature <= 0.0f) {
    kernels::top_k(logits.data(), logits.size(), 1, &best);
    return {{best, 1.0}};
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
  // min-p keeps the tokens at least min_p times as likely as the first (probs[0]).
  if (options_.min_p > 0.0f) {
    const double floor = options_.min_p * probs[0];
    keep = static_cast<size_t>(std::find_if(probs.begin() + 1,
                                            probs.begin() + static_cast<std::ptrdiff_t>(keep),
                                            [&](double p) { return p < floor; }) -
                               probs.begin());
  }
  const double total =
      std::accumulate(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  std::vector<std::pair<int32_t, double>> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {order_[i], probs[i] / total};
  return out;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::vector<std::pair<int32_t, double>> kept = candidates(logits);
  int32_t token = kept.back().first;
  if (options_.temperature > 0.0f) {  // one draw per sampled token, even when one is kept
    double r = static_cast<double>(next_random(state_) >> 11) * 0x1.0p-53;
    for (const auto& [id, p] : kept) {
      if ((r -= p) < 0) {
        token = id;
        break;
      }
    }
  }
  if (options_.frequency_penalty != 0.0f || options_.presence_penalty != 0.0f) ++counts_[token];
  return token;
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, size_t n) {
  n = std::min(n, logits.size());
  if (n == 0) return {};
  std::vector<int32_t> ids(n);
  kernels::top_k(logits.data(), logits.size(), n, ids.data());
  const double lse = log_sum_exp(logits);
  std::vector<TokenLogprob> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = {ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - lse)};
  return out;
}

float token_logprob(std::span<const float> logits, int32_t token) {
  return static_cast<float>(logits[static_cast<size_t>(token)] - log_sum_exp(logits));
}

}  // namespace edgellm
