// Sampler: temperature 0 is greedy, top-k, top-p and min-p restrict the support
// to exactly the tokens they should, penalties follow OpenAI's formula, the
// kept distribution equals a straightforward reference on odd vocabulary
// sizes, a seed reproduces a run, and logprobs are a log-softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "edgellm/session.h"

namespace edgellm {
namespace {

// Logits whose softmax (temperature 1) is {0.4, 0.3, 0.2, 0.1} at ids {5, 2, 7, 0}
// among 9 ids; the rest are -inf-like.
std::vector<float> four_token_logits() {
  std::vector<float> logits(9, -1e4f);
  logits[5] = std::log(0.4f);
  logits[2] = std::log(0.3f);
  logits[7] = std::log(0.2f);
  logits[0] = std::log(0.1f);
  return logits;
}

std::map<int32_t, int> histogram(const SamplerOptions& o, const std::vector<float>& logits,
                                 int draws) {
  Sampler s(o);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[s.sample(logits)];
  return h;
}

std::set<int32_t> support(const std::map<int32_t, int>& h) {
  std::set<int32_t> ids;
  for (const auto& [id, n] : h) ids.insert(id);
  return ids;
}

TEST(Sampler, TemperatureZeroIsGreedy) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  logits[613] = 5.0f;
  for (uint64_t seed : {0u, 1u, 99u}) {
    Sampler s({.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = seed});
    EXPECT_EQ(s.sample(logits), 613);
  }
}

TEST(Sampler, FullSupportFollowsTheSoftmax) {
  const auto h = histogram({.temperature = 1.0f, .seed = 1}, four_token_logits(), 20000);
  EXPECT_EQ(support(h), (std::set<int32_t>{0, 2, 5, 7}));
  EXPECT_NEAR(h.at(5) / 20000.0, 0.4, 0.02);
  EXPECT_NEAR(h.at(2) / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(h.at(7) / 20000.0, 0.2, 0.02);
  EXPECT_NEAR(h.at(0) / 20000.0, 0.1, 0.02);
}

// Temperature T samples softmax(logits / T): p_i proportional to p1_i^(1/T). At T = 0.5 the
// four probabilities become {16, 9, 4, 1} / 30, at T = 2 their square roots, normalized.
TEST(Sampler, TemperatureScalesTheDistribution) {
  const double p1[] = {0.4, 0.3, 0.2, 0.1};
  const int32_t ids[] = {5, 2, 7, 0};
  for (float t : {0.5f, 2.0f}) {
    double z = 0;
    for (double p : p1) z += std::pow(p, 1.0 / t);
    const auto h = histogram({.temperature = t, .seed = 4}, four_token_logits(), 20000);
    for (int i = 0; i < 4; ++i) {
      const double want = std::pow(p1[i], 1.0 / t) / z;
      // 5 sigma of a binomial proportion over 20000 draws is at most 0.018.
      EXPECT_NEAR(h.count(ids[i]) ? h.at(ids[i]) / 20000.0 : 0.0, want, 0.018)
          << "temperature " << t << " id " << ids[i];
    }
  }
}

TEST(Sampler, TopKRestrictsTheSupport) {
  const auto h = histogram({.temperature = 1.0f, .top_k = 2, .seed = 2}, four_token_logits(), 5000);
  EXPECT_EQ(support(h), (std::set<int32_t>{5, 2}));
  EXPECT_NEAR(h.at(5) / 5000.0, 0.4 / 0.7, 0.03);  // renormalised over the k kept
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // 0.4 + 0.3 = 0.7 >= 0.65: ids 5 and 2; at 0.75 id 7 joins (0.9).
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .top_p = 0.65f, .seed = 3}, four_token_logits(),
                              5000)),
            (std::set<int32_t>{5, 2}));
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .top_p = 0.75f, .seed = 3}, four_token_logits(),
                              5000)),
            (std::set<int32_t>{5, 2, 7}));
  // top-k applies first, then top-p within it.
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .top_k = 3, .top_p = 0.3f, .seed = 3},
                              four_token_logits(), 2000)),
            (std::set<int32_t>{5}));
}

TEST(Sampler, MinPKeepsTokensWithinAFractionOfTheTop) {
  // Relative to the top token's 0.4: 0.45 keeps 0.3 and 0.2 (ratios 0.75, 0.5), not 0.1 (0.25).
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .seed = 4, .min_p = 0.45f}, four_token_logits(),
                              5000)),
            (std::set<int32_t>{5, 2, 7}));
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .seed = 4, .min_p = 0.6f}, four_token_logits(),
                              5000)),
            (std::set<int32_t>{5, 2}));
  // After the temperature: at 0.5 the ratios square (0.5625, 0.25, 0.0625), so 0.45 keeps two.
  EXPECT_EQ(support(histogram({.temperature = 0.5f, .seed = 4, .min_p = 0.45f}, four_token_logits(),
                              5000)),
            (std::set<int32_t>{5, 2}));
  // With top-k and top-p the tightest cut wins; min-p 1 leaves the top token alone.
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .top_k = 2, .seed = 4, .min_p = 0.2f},
                              four_token_logits(), 2000)),
            (std::set<int32_t>{5, 2}));
  EXPECT_EQ(support(histogram({.temperature = 1.0f, .seed = 4, .min_p = 1.0f}, four_token_logits(),
                              2000)),
            (std::set<int32_t>{5}));
  // The kept tokens are renormalised among themselves: 0.4 / 0.9.
  const auto h =
      histogram({.temperature = 1.0f, .seed = 5, .min_p = 0.45f}, four_token_logits(), 20000);
  EXPECT_NEAR(h.at(5) / 20000.0, 0.4 / 0.9, 0.02);
}

TEST(Sampler, SeedReproducesAndDifferentSeedsDiffer) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 0.1f * static_cast<float>(i % 7);
  auto draw = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.sample(logits));
    return ids;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

// The reference: the whole pipeline spelled out with a full sort, in double.
// `history` holds the tokens picked before (for the penalties).
std::vector<std::pair<int32_t, double>> reference_candidates(std::vector<float> logits,
                                                             const SamplerOptions& o,
                                                             const std::vector<int32_t>& history) {
  std::map<int32_t, int> counts;
  for (int32_t t : history) ++counts[t];
  for (const auto& [t, n] : counts)
    logits[t] -= o.frequency_penalty * static_cast<float>(n) + o.presence_penalty;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.temperature <= 0.0f) return {{ids[0], 1.0}};
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < ids.size()) ids.resize(o.top_k);
  std::vector<double> p;
  for (int32_t id : ids)
    p.push_back(std::exp((double(logits[id]) - logits[ids[0]]) / o.temperature));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= z;
  size_t keep = ids.size();
  double mass = 0.0;
  for (size_t i = 0; i < ids.size() && o.top_p < 1.0f; ++i)
    if ((mass += p[i]) >= o.top_p) {
      keep = i + 1;
      break;
    }
  size_t m = 1;
  while (m < keep && p[m] >= o.min_p * p[0]) ++m;
  keep = m;
  const double kept =
      std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < keep; ++i) out.push_back({ids[i], p[i] / kept});
  return out;
}

// Distinct logits (no ties, so the order is unambiguous) of an odd vocabulary size.
std::vector<float> odd_logits(size_t n, uint32_t salt) {
  std::vector<float> logits(n);
  for (size_t i = 0; i < n; ++i)
    logits[i] = 3.0f * std::sin(0.7f * static_cast<float>(i) + static_cast<float>(salt)) +
                1e-4f * static_cast<float>(i);
  return logits;
}

// The same tokens with the same probabilities (candidates() walks them in its own order).
void expect_same_candidates(std::vector<std::pair<int32_t, double>> got,
                            std::vector<std::pair<int32_t, double>> want) {
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << "entry " << i;
    EXPECT_NEAR(got[i].second, want[i].second, 1e-9) << "token " << got[i].first;
  }
}

TEST(Sampler, CandidatesEqualTheReferenceOnOddShapes) {
  const std::vector<SamplerOptions> settings = {
      {.temperature = 0.0f},
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_p = 0.9f},
      {.temperature = 1.3f, .top_k = 5, .top_p = 0.8f},
      {.temperature = 1.0f, .min_p = 0.05f},
      {.temperature = 0.5f, .top_k = 40, .top_p = 0.95f, .min_p = 0.1f},
      {.temperature = 1.0f, .min_p = 0.3f, .frequency_penalty = 0.8f, .presence_penalty = 0.5f},
      {.temperature = 0.0f, .frequency_penalty = 1.5f, .presence_penalty = -0.3f},
      {.temperature = 0.9f, .frequency_penalty = -0.5f},
      {.temperature = 0.3f, .top_p = 0.9999f},
      {.temperature = 30.0f, .top_p = 0.5f, .min_p = 0.9f},  // flat: p reached far down
      {.temperature = 0.2f, .top_k = 1}};
  for (size_t n : {1u, 2u, 7u, 33u, 1000u}) {
    for (size_t k = 0; k < settings.size(); ++k) {
      SCOPED_TRACE("vocab " + std::to_string(n) + ", setting " + std::to_string(k));
      Sampler s(settings[k]);
      std::vector<int32_t> history;
      for (uint32_t step = 0; step < 6; ++step) {
        const std::vector<float> logits = odd_logits(n, step);
        expect_same_candidates(s.candidates(logits),
                               reference_candidates(logits, settings[k], history));
        history.push_back(s.sample(logits));
      }
    }
  }
}

TEST(Sampler, TopPReachesIntoALongTail) {
  // One likely id and 2000 at 5e-5 of its weight each (9% of the mass together):
  // top-p 0.99 must keep the likely one and most of the tail, in that order.
  std::vector<float> logits(2001, std::log(5e-5f));
  logits[1234] = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) logits[i] -= 1e-7f * static_cast<float>(i);
  const SamplerOptions o{.temperature = 1.0f, .top_p = 0.99f};
  const auto got = Sampler(o).candidates(logits);
  EXPECT_GT(got.size(), 1000u);
  expect_same_candidates(got, reference_candidates(logits, o, {}));
}

TEST(Sampler, PenaltiesSteerGreedyAwayFromRepeats) {
  // Greedy on the same logits: without penalties id 5 forever; a frequency
  // penalty of 0.2 costs id 5 0.2 per pick: log(0.4) - 0.2n < log(0.3) once n >= 2.
  const std::vector<float> logits = four_token_logits();
  auto run = [&](SamplerOptions o) {
    Sampler s(o);
    std::vector<int32_t> ids;
    for (int i = 0; i < 6; ++i) ids.push_back(s.sample(logits));
    return ids;
  };
  EXPECT_EQ(run({}), (std::vector<int32_t>{5, 5, 5, 5, 5, 5}));
  EXPECT_EQ(run({.frequency_penalty = 0.2f}), (std::vector<int32_t>{5, 5, 2, 5, 2, 5}));
  // A presence penalty is paid once: each of the four is picked once, then the
  // order repeats as if unpenalised among equals.
  EXPECT_EQ(run({.presence_penalty = 5.0f}), (std::vector<int32_t>{5, 2, 7, 0, 5, 5}));
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  for (size_t n : {1u, 3u, 17u, 1001u}) {
    const std::vector<float> logits = odd_logits(n, 3);
    double z = 0.0;
    for (float x : logits) z += std::exp(double(x));
    const std::vector<TokenLogprob> top = top_logprobs(logits, 5);
    ASSERT_EQ(top.size(), std::min<size_t>(5, n));
    for (size_t i = 0; i < top.size(); ++i) {
      EXPECT_NEAR(top[i].logprob, double(logits[top[i].token]) - std::log(z), 1e-5);
      if (i > 0) {
        EXPECT_GE(top[i - 1].logprob, top[i].logprob);
      }
      EXPECT_FLOAT_EQ(token_logprob(logits, top[i].token), top[i].logprob);
    }
    EXPECT_EQ(top[0].token, Sampler({}).sample(logits));  // the greedy pick is the top-1
  }
  EXPECT_TRUE(top_logprobs(odd_logits(4, 0), 0).empty());
}

}  // namespace
}  // namespace edgellm
