// Sampler: temperature 0 is greedy, top-k, top-p and min-p restrict the support to
// exactly the tokens they should, and a seed reproduces a run.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

}  // namespace
}  // namespace edgellm
