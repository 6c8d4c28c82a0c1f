// Automatic prefix caching: the KV state of prompt prefixes already computed
// (a system prompt shared by many requests, a chat's earlier turns), kept so a
// later prompt that starts the same way loads it instead of prefilling it.
//
// Prompts are cut into fixed-size blocks of tokens. A block is found by a hash
// chained over every token before it and its own, and checked against its
// parent and tokens, so a hit is always the same whole prefix, never a
// collision. A Context's KV is one contiguous run per sequence, so a hit is a
// copy of the blocks' bytes into the new sequence's cache (far cheaper than
// their prefill); the bytes are those the prefill computed, so the outputs are
// bit-identical with and without the cache (see kMinPrefillChunk).
//
// The blocks' bytes stay under a budget: storing past it evicts the least
// recently used block that no Chain holds and that has no cached child (so
// every cached block stays reachable from the first). One thread uses a cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "edgellm/session.h"

namespace edgellm {

class PrefixCache {
  struct Block;

 public:
  static constexpr size_t kDefaultBlockTokens = 16;

  // `budget_bytes` of KV for the blocks of contexts of `model`, block_tokens each.
  PrefixCache(const Model& model, size_t budget_bytes, size_t block_tokens = kDefaultBlockTokens);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The cached blocks that start one prompt, in order. While a Chain holds a
  // block (a reference count), no eviction removes it.
  class Chain {
   public:
    Chain() = default;
    ~Chain() { release(); }
    Chain(Chain&& o) noexcept;
    Chain& operator=(Chain&& o) noexcept;
    size_t tokens() const;                          // the prompt tokens its blocks cover
    size_t size() const { return blocks_.size(); }  // its blocks
    void release();                                 // lets its blocks go (also on destruction)

   private:
    friend class PrefixCache;
    PrefixCache* cache_ = nullptr;
    std::vector<Block*> blocks_;
  };

  // The longest chain of cached blocks that prefixes `tokens` (whole blocks
  // only), held; it marks them recently used.
  Chain match(std::span<const int32_t> tokens);
  // Writes the KV of the first `n` tokens of `chain` (whole blocks, n <=
  // chain.tokens()) into positions [0, n) of `context`.
  void load(const Chain& chain, size_t n, Context& context) const;
  // Caches the whole blocks of `tokens` past `chain` (which must prefix them),
  // their KV read from `context`, which holds positions [0, tokens.size());
  // the chain grows by, and holds, each block stored. Stops at the first block
  // that does not fit the budget when no other block can be evicted.
  void store(Chain& chain, std::span<const int32_t> tokens, const Context& context);
  // The KV bytes of the chain's block `i` (block_bytes() of them), e.g. to
  // write them to a file (prefix_cache_file.h).
  std::span<const uint8_t> block_kv(const Chain& chain, size_t i) const;
  // Caches one block of block_tokens() `tokens` after `chain`, its KV given as
  // bytes (read back from a file); the chain grows by, and holds, it. False,
  // with the chain unchanged, when it does not fit the budget.
  bool append(Chain& chain, std::span<const int32_t> tokens, std::span<const uint8_t> kv);

  size_t block_tokens() const { return block_tokens_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t budget_bytes() const { return budget_bytes_; }
  size_t blocks() const { return lru_.size(); }
  size_t bytes() const { return lru_.size() * block_bytes_; }
  uint64_t evictions() const { return evictions_; }

 private:
  Block* find(const Block* parent, uint64_t hash, std::span<const int32_t> tokens) const;
  // The block of `tokens` after the chain's last, found or created with its KV
  // written by `fill`, now held by the chain; false when it does not fit.
  bool extend(Chain& chain, std::span<const int32_t> tokens,
              const std::function<void(std::span<uint8_t>)>& fill);
  bool make_room();
  void touch(Block* b);

  size_t budget_bytes_, block_tokens_, block_bytes_;
  std::unordered_multimap<uint64_t, std::unique_ptr<Block>> blocks_;  // by chained hash
  std::list<Block*> lru_;  // every block, most recently used first
  uint64_t evictions_ = 0;
};

}  // namespace edgellm
