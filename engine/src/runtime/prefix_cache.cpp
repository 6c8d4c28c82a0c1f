#include "edgellm/prefix_cache.h"

#include <algorithm>
#include <new>
#include <utility>

#include "edgellm/error.h"

namespace edgellm {

struct PrefixCache::Block {
  uint64_t hash = 0;  // chained: the parent's hash and this block's tokens
  Block* parent = nullptr;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> kv;  // Context::save_kv of the block's positions
  int refs = 0;             // Chains holding it
  int children = 0;         // cached blocks whose parent it is
  std::list<Block*>::iterator lru;
};

namespace {

// FNV-1a over the token ids, seeded with the parent's hash.
uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent ^ 0xcbf29ce484222325ULL;
  for (int32_t t : tokens)
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<uint32_t>(t) >> (8 * i) & 0xffu;
      h *= 0x100000001b3ULL;
    }
  return h;
}

}  // namespace

PrefixCache::PrefixCache(const Model& model, size_t budget_bytes, size_t block_tokens)
    : budget_bytes_(budget_bytes), block_tokens_(block_tokens) {
  check(block_tokens >= 1, "prefix cache blocks need at least one token");
  check(static_cast<int>(block_tokens) <= model.max_context(),
        "prefix cache blocks of " + std::to_string(block_tokens) +
            " tokens exceed the context of " + std::to_string(model.max_context()));
  // A cache's bytes are the same for every position (Context::kv_bytes).
  block_bytes_ = model.kv_cache_bytes() / static_cast<size_t>(model.max_context()) * block_tokens;
}

PrefixCache::~PrefixCache() = default;

PrefixCache::Chain::Chain(Chain&& o) noexcept
    : cache_(std::exchange(o.cache_, nullptr)), blocks_(std::move(o.blocks_)) {
  o.blocks_.clear();
}

PrefixCache::Chain& PrefixCache::Chain::operator=(Chain&& o) noexcept {
  if (this != &o) {
    release();
    cache_ = std::exchange(o.cache_, nullptr);
    blocks_ = std::move(o.blocks_);
    o.blocks_.clear();
  }
  return *this;
}

size_t PrefixCache::Chain::tokens() const {
  return cache_ ? blocks_.size() * cache_->block_tokens_ : 0;
}

void PrefixCache::Chain::release() {
  for (Block* b : blocks_) --b->refs;
  blocks_.clear();
}

PrefixCache::Block* PrefixCache::find(const Block* parent, uint64_t hash,
                                      std::span<const int32_t> tokens) const {
  const auto [first, last] = blocks_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    Block* b = it->second.get();
    if (b->parent == parent && std::equal(tokens.begin(), tokens.end(), b->tokens.begin()))
      return b;
  }
  return nullptr;
}

void PrefixCache::touch(Block* b) {
  lru_.splice(lru_.begin(), lru_, b->lru);
}

PrefixCache::Chain PrefixCache::match(std::span<const int32_t> tokens) {
  Chain chain;
  chain.cache_ = this;
  const Block* parent = nullptr;
  for (size_t at = 0; at + block_tokens_ <= tokens.size(); at += block_tokens_) {
    const auto block = tokens.subspan(at, block_tokens_);
    Block* b = find(parent, chain_hash(parent ? parent->hash : 0, block), block);
    if (!b) break;
    ++b->refs;
    touch(b);
    chain.blocks_.push_back(b);
    parent = b;
  }
  return chain;
}

void PrefixCache::load(const Chain& chain, size_t n, Context& context) const {
  check(chain.cache_ == this && n <= chain.tokens() && n % block_tokens_ == 0,
        "prefix cache: a load of " + std::to_string(n) + " tokens from a chain of " +
            std::to_string(chain.tokens()) + " (whole blocks only)");
  for (size_t i = 0; i < n / block_tokens_; ++i)
    context.load_kv(static_cast<int>(i * block_tokens_), static_cast<int>(block_tokens_),
                    chain.blocks_[i]->kv);
}

bool PrefixCache::make_room() {
  while (bytes() + block_bytes_ > budget_bytes_) {
    auto victim = std::find_if(lru_.rbegin(), lru_.rend(),
                               [](const Block* b) { return b->refs == 0 && b->children == 0; });
    if (victim == lru_.rend()) return false;
    Block* b = *victim;
    if (b->parent) --b->parent->children;
    lru_.erase(b->lru);
    const auto [first, last] = blocks_.equal_range(b->hash);
    for (auto it = first; it != last; ++it)
      if (it->second.get() == b) {
        blocks_.erase(it);
        break;
      }
    ++evictions_;
  }
  return true;
}

bool PrefixCache::extend(Chain& chain, std::span<const int32_t> tokens,
                         const std::function<void(std::span<uint8_t>)>& fill) {
  Block* parent = chain.blocks_.empty() ? nullptr : chain.blocks_.back();
  const uint64_t hash = chain_hash(parent ? parent->hash : 0, tokens);
  Block* b = find(parent, hash, tokens);
  if (!b) {
    if (!make_room()) return false;
    std::unique_ptr<Block> owned;
    try {
      owned = std::make_unique<Block>();
      owned->tokens.assign(tokens.begin(), tokens.end());
      owned->kv.resize(block_bytes_);
    } catch (const std::bad_alloc&) {
      return false;  // a cache is an optimisation: out of memory, it just stops growing
    }
    b = owned.get();
    b->hash = hash;
    b->parent = parent;
    fill(b->kv);
    if (parent) ++parent->children;
    lru_.push_front(b);
    b->lru = lru_.begin();
    blocks_.emplace(hash, std::move(owned));
  }
  ++b->refs;
  touch(b);
  chain.blocks_.push_back(b);
  return true;
}

void PrefixCache::store(Chain& chain, std::span<const int32_t> tokens, const Context& context) {
  check(chain.cache_ == this && chain.tokens() <= tokens.size(),
        "prefix cache: storing past a chain of another prompt");
  for (size_t at = chain.tokens(); at + block_tokens_ <= tokens.size(); at += block_tokens_) {
    const auto fill = [&](std::span<uint8_t> kv) {
      context.save_kv(static_cast<int>(at), static_cast<int>(block_tokens_), kv);
    };
    if (!extend(chain, tokens.subspan(at, block_tokens_), fill)) return;
  }
}

std::span<const uint8_t> PrefixCache::block_kv(const Chain& chain, size_t i) const {
  check(chain.cache_ == this && i < chain.blocks_.size(),
        "prefix cache: block " + std::to_string(i) + " of a chain of " +
            std::to_string(chain.blocks_.size()));
  return chain.blocks_[i]->kv;
}

bool PrefixCache::append(Chain& chain, std::span<const int32_t> tokens,
                         std::span<const uint8_t> kv) {
  check((chain.cache_ == this || (!chain.cache_ && chain.blocks_.empty())) &&
            tokens.size() == block_tokens_ && kv.size() == block_bytes_,
        "prefix cache: appending a block of " + std::to_string(tokens.size()) + " tokens and " +
            std::to_string(kv.size()) + " bytes (blocks hold " + std::to_string(block_tokens_) +
            " tokens, " + std::to_string(block_bytes_) + " bytes)");
  chain.cache_ = this;
  return extend(chain, tokens,
                [&](std::span<uint8_t> out) { std::copy(kv.begin(), kv.end(), out.begin()); });
}

}  // namespace edgellm
