// The prefix cache and the KV transfer under it (tiny random checkpoints): a
// prefix's KV loaded into another context continues bit for bit as if it had
// been prefilled there, for every KV dtype; blocks match whole and chained;
// eviction keeps the budget, takes the least recently used, and never a block
// a Chain holds.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/prefix_cache.h"
#include "edgellm/session.h"
#include "tiny_model.h"

namespace edgellm {
namespace {

using testing::fast_model;
using testing::TinyModel;
using testing::write_tiny_session_model;

constexpr int kContext = 128;

// The fast deployed arithmetic with the given KV dtype; head_dim 32 so that
// q8_0 and the bf16 attention kernels apply.
TinyModel tiny() {
  return write_tiny_session_model(R"(, "head_dim": 32, "max_position_embeddings": 128)");
}

std::vector<int32_t> prompt(size_t n, int seed) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((7 * i + 3 * seed + 1) % 90);
  return p;
}

std::vector<float> copy(std::span<const float> s) {
  return {s.begin(), s.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<uint8_t> saved(const Context& c, int start, int n) {
  std::vector<uint8_t> bytes(c.kv_bytes(n));
  c.save_kv(start, n, bytes);
  return bytes;
}

// (KV dtype, ISA tier; "" is the CPU's best). A tier the CPU lacks runs its best.
class KvTransfer : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

INSTANTIATE_TEST_SUITE_P(KvDtypes, KvTransfer,
                         ::testing::Combine(::testing::Values("fp32", "bf16", "q8_0"),
                                            ::testing::Values("", "avx2", "scalar")));

// What the scheduler relies on: chunks of at least kMinPrefillChunk tokens, or
// a loaded prefix and the rest, give one prefill's KV and logits bit for bit.
TEST_P(KvTransfer, LoadedPrefixContinuesBitForBit) {
  const TinyModel m = tiny();
  const Model model = fast_model(m, std::get<0>(GetParam()), kContext, std::get<1>(GetParam()));
  const std::vector<int32_t> p = prompt(50, 1);
  const std::span<const int32_t> all(p);
  Context whole(model);
  const std::vector<float> expected = copy(whole.prefill(all));

  Context chunked(model);
  chunked.prefill(all.subspan(0, 16));
  chunked.prefill(all.subspan(16, 18), 16);
  EXPECT_TRUE(same_bits(copy(chunked.prefill(all.subspan(34), 34)), expected))
      << "chunks of >= kMinPrefillChunk tokens";

  for (int cached : {16, 32, 34}) {
    Context reused(model);
    reused.load_kv(0, cached, saved(whole, 0, cached));
    EXPECT_EQ(reused.position(), cached);
    const std::vector<float> got = copy(reused.prefill(all.subspan(cached), cached));
    EXPECT_TRUE(same_bits(got, expected)) << cached << " cached positions";
    EXPECT_EQ(saved(reused, 0, 50), saved(whole, 0, 50)) << cached << " cached positions";
  }
}

TEST_P(KvTransfer, BadSpansAreErrors) {
  const TinyModel m = tiny();
  const Model model = fast_model(m, std::get<0>(GetParam()), kContext, std::get<1>(GetParam()));
  Context c(model);
  std::vector<uint8_t> bytes(c.kv_bytes(4));
  EXPECT_THROW(c.save_kv(-1, 4, bytes), Error);
  EXPECT_THROW(c.save_kv(kContext - 3, 4, bytes), Error);
  EXPECT_THROW(c.save_kv(0, 3, bytes), Error);  // buffer of the wrong size
  EXPECT_THROW(c.load_kv(0, 5, bytes), Error);
  EXPECT_THROW(c.kv_bytes(-1), Error);
  EXPECT_NO_THROW(c.load_kv(kContext - 4, 4, bytes));
}

// The scheduler's chunking: whatever the budget, every chunk and every rest is
// at least kMinPrefillChunk tokens (or the whole of a shorter prompt), each
// chunk makes progress and the budget is passed by less than 2 x that.
TEST(PrefillChunkSize, ChunksAndRestsAreNeverShort) {
  const size_t min = kMinPrefillChunk;
  for (size_t prompt = 1; prompt <= 100; ++prompt)
    for (size_t budget = 0; budget <= 70; ++budget) {
      size_t left = prompt;
      while (left > 0) {
        const size_t n = prefill_chunk_size(left, budget);
        ASSERT_TRUE(n >= 1 && n <= left) << prompt << " " << budget << " " << left;
        ASSERT_TRUE(n >= min || n == prompt) << prompt << " " << budget << " " << left;
        ASSERT_TRUE(left - n == 0 || left - n >= min) << prompt << " " << budget << " " << left;
        ASSERT_LT(n, std::max(budget, min) + 2 * min) << prompt << " " << budget;
        if (budget >= left) {
          ASSERT_EQ(n, left);
        }
        left -= n;
      }
    }
}

// Prefilled in the chunks prefill_chunk_size gives for a small budget, a prompt
// gets one prefill's logits bit for bit.
TEST(PrefillChunkSize, ChunkedPrefillIsBitIdentical) {
  const TinyModel m = tiny();
  const Model model = fast_model(m, "bf16", kContext);
  const std::vector<int32_t> p = prompt(70, 4);
  Context whole(model), chunked(model);
  const std::vector<float> expected = copy(whole.prefill(p));
  for (size_t budget : {0, 5, 17, 40}) {
    std::vector<float> got;
    for (size_t at = 0; at < p.size();) {
      const size_t n = prefill_chunk_size(p.size() - at, budget);
      got = copy(chunked.prefill(std::span(p).subspan(at, n), static_cast<int>(at)));
      at += n;
    }
    EXPECT_TRUE(same_bits(got, expected)) << "budget " << budget;
  }
}

// A cache of `blocks` blocks of 16 tokens.
struct Fixture {
  TinyModel m = tiny();
  Model model = fast_model(m, "bf16", kContext);
  Context scratch{model};

  size_t block_bytes() const { return PrefixCache(model, 0).block_bytes(); }
  // Prefills `p` and stores its whole blocks; the chain is released.
  void store(PrefixCache& cache, const std::vector<int32_t>& p) {
    scratch.prefill(p);
    PrefixCache::Chain chain = cache.match(p);
    cache.store(chain, p, scratch);
  }
};

TEST(PrefixCache, MatchesWholeChainedBlocksOnly) {
  Fixture f;
  PrefixCache cache(f.model, 100 * f.block_bytes());
  EXPECT_EQ(cache.block_bytes(), f.scratch.kv_bytes(16));
  const std::vector<int32_t> p = prompt(40, 1);
  EXPECT_EQ(cache.match(p).tokens(), 0u);
  f.store(cache, p);
  EXPECT_EQ(cache.blocks(), 2u);  // 40 tokens: two whole blocks, 8 left over
  EXPECT_EQ(cache.match(p).tokens(), 32u);
  std::vector<int32_t> q = p;
  q.resize(31);
  EXPECT_EQ(cache.match(q).tokens(), 16u) << "a prefix that ends inside a block";
  q = p;
  q[20] = 89;
  EXPECT_EQ(cache.match(q).tokens(), 16u) << "a prompt that diverges inside the second block";
  q = p;
  q[3] = 89;
  EXPECT_EQ(cache.match(q).tokens(), 0u) << "diverges in the first block";
  // The second block's tokens after another first block: a different prefix.
  std::vector<int32_t> r = prompt(16, 2);
  r.insert(r.end(), p.begin() + 16, p.begin() + 32);
  EXPECT_EQ(cache.match(r).tokens(), 0u) << "blocks are chained, not matched alone";
  f.store(cache, q);  // shares no block with p
  EXPECT_EQ(cache.blocks(), 4u);
  EXPECT_EQ(cache.match(q).tokens(), 32u);
}

TEST(PrefixCache, LoadedBlocksContinueBitForBit) {
  Fixture f;
  PrefixCache cache(f.model, 100 * f.block_bytes());
  const std::vector<int32_t> p = prompt(60, 3);
  Context whole(f.model);
  const std::vector<float> expected = copy(whole.prefill(p));
  PrefixCache::Chain stored = cache.match(p);
  cache.store(stored, p, whole);
  EXPECT_EQ(stored.tokens(), 48u);
  stored.release();
  EXPECT_EQ(stored.tokens(), 0u);

  PrefixCache::Chain chain = cache.match(p);
  ASSERT_EQ(chain.tokens(), 48u);
  Context reused(f.model);
  EXPECT_THROW(cache.load(chain, 40, reused), Error) << "whole blocks only";
  EXPECT_THROW(cache.load(chain, 64, reused), Error) << "past the chain";
  cache.load(chain, 32, reused);
  EXPECT_TRUE(same_bits(copy(reused.prefill(std::span(p).subspan(32), 32)), expected));
}

TEST(PrefixCache, EvictsTheLeastRecentlyUsedLeafWithinTheBudget) {
  Fixture f;
  PrefixCache cache(f.model, 3 * f.block_bytes());
  const std::vector<int32_t> x = prompt(32, 1), y = prompt(32, 2), z = prompt(32, 3);
  f.store(cache, x);
  f.store(cache, y);  // the fourth block evicts x's leaf, not x's first block (a parent)
  EXPECT_EQ(cache.blocks(), 3u);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(cache.match(x).tokens(), 16u);  // now the most recently used
  EXPECT_EQ(cache.match(y).tokens(), 32u);  // and now y
  f.store(cache, z);                        // evicts x's block, then y's leaf
  EXPECT_LE(cache.bytes(), cache.budget_bytes());
  EXPECT_EQ(cache.match(x).tokens(), 0u);
  EXPECT_EQ(cache.match(y).tokens(), 16u);
  EXPECT_EQ(cache.match(z).tokens(), 32u);
  EXPECT_EQ(cache.evictions(), 3u);
}

TEST(PrefixCache, HeldBlocksSurviveEvictionPressure) {
  Fixture f;
  PrefixCache cache(f.model, 2 * f.block_bytes());
  const std::vector<int32_t> x = prompt(40, 1), y = prompt(40, 2);
  Context whole(f.model);
  const std::vector<float> expected = copy(whole.prefill(x));
  {
    PrefixCache::Chain chain = cache.match(x);
    cache.store(chain, x, whole);
  }
  PrefixCache::Chain held = cache.match(x);  // a request about to load them
  ASSERT_EQ(held.tokens(), 32u);
  for (int i = 0; i < 3; ++i) f.store(cache, y);
  EXPECT_EQ(cache.evictions(), 0u);
  EXPECT_EQ(cache.match(y).tokens(), 0u) << "no room: every block is held";
  Context reused(f.model);
  cache.load(held, 16, reused);  // leaving kMinPrefillChunk tokens or more
  EXPECT_TRUE(same_bits(copy(reused.prefill(std::span(x).subspan(16), 16)), expected));
  held.release();
  f.store(cache, y);
  EXPECT_EQ(cache.evictions(), 2u);
  EXPECT_EQ(cache.match(y).tokens(), 32u);
  EXPECT_EQ(cache.match(x).tokens(), 0u);
}

TEST(PrefixCache, ZeroBudgetStoresNothing) {
  Fixture f;
  PrefixCache cache(f.model, 0);
  f.store(cache, prompt(40, 1));
  EXPECT_EQ(cache.blocks(), 0u);
  EXPECT_EQ(cache.match(prompt(40, 1)).tokens(), 0u);
}

}  // namespace
}  // namespace edgellm
