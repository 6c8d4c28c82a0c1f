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

// No full sort of the vocabulary (~49k ids: milliseconds a token): the support
// is the top_k ids (a partial selection) or every id in index order; min-p is a
// threshold on that; only top-p needs an order, and it sorts just the heavy
// tokens when their mass already reaches p.
std::vector<std::pair<int32_t, double>> Sampler::candidates(std::span<const float> raw) {
  const std::span<const float> logits = penalized(raw);
  if (options_.temperature <= 0.0f) {
    int32_t best = 0;
    kernels::top_k(logits.data(), logits.size(), 1, &best);
    return {{best, 1.0}};
  }
  // The support before the cut-offs: the top_k ids (most likely first) or all.
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < logits.size()) {
    order_.resize(static_cast<size_t>(options_.top_k));
    kernels::top_k(logits.data(), logits.size(), order_.size(), order_.data());
  } else {
    order_.resize(logits.size());
    std::iota(order_.begin(), order_.end(), 0);
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const int32_t id : order_) max_logit = std::max(max_logit, logits[id]);
  // weight_[i]: probability of order_[i] times the normaliser (the most likely one's is 1).
  weight_.resize(order_.size());
  double sum = 0.0;
  for (size_t i = 0; i < order_.size(); ++i)
    sum += weight_[i] =
        std::exp((static_cast<double>(logits[order_[i]]) - max_logit) / options_.temperature);
  // min-p keeps the ids at least min_p times as likely as the most likely one.
  const double floor = options_.min_p;
  std::vector<size_t> kept;  // positions in order_
  if (options_.top_p >= 1.0f) {
    for (size_t i = 0; i < order_.size(); ++i)
      if (weight_[i] >= floor) kept.push_back(i);
  } else {
    // top-p keeps the smallest most-likely-first prefix whose mass reaches p. The ids
    // above a weight `heavy` are the first ones in that order: when their mass reaches
    // p the prefix lies among them, else all are sorted.
    for (const double heavy : {1e-4, 0.0}) {
      kept.clear();
      double heavy_mass = 0.0;
      for (size_t i = 0; i < order_.size(); ++i)
        if (weight_[i] >= heavy) {
          kept.push_back(i);
          heavy_mass += weight_[i] / sum;
        }
      if (heavy > 0.0 && heavy_mass < options_.top_p) continue;
      std::sort(kept.begin(), kept.end(), [&](size_t a, size_t b) {
        return weight_[a] != weight_[b] ? weight_[a] > weight_[b] : order_[a] < order_[b];
      });
      size_t n = 0;
      for (double mass = 0.0; n < kept.size();) {
        mass += weight_[kept[n++]] / sum;
        if (mass >= options_.top_p) break;
      }
      kept.resize(n);
      break;
    }
    std::erase_if(kept, [&](size_t i) { return weight_[i] < floor; });
  }
  double total = 0.0;
  for (const size_t i : kept) total += weight_[i];
  std::vector<std::pair<int32_t, double>> out(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) out[i] = {order_[kept[i]], weight_[kept[i]] / total};
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
