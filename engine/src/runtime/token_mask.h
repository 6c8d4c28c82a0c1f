// The tokens a JSON grammar allows next: the vocabulary's byte strings in a
// trie (flat, pre-order), walked depth-first with the matcher's state, a
// subtree skipped as soon as its prefix leaves the grammar.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "edgellm/tokenizer.h"
#include "runtime/json_matcher.h"

namespace edgellm {

// The vocabulary as bytes, built once per tokenizer (TokenIndex::of caches it).
class TokenIndex {
 public:
  explicit TokenIndex(const Tokenizer& tokenizer);
  // The index of `tokenizer`, built on first use and shared afterwards.
  static std::shared_ptr<const TokenIndex> of(const Tokenizer& tokenizer);

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;   // 1 for a first byte
    uint32_t end = 0;     // one past the subtree's last node
    uint32_t tokens = 0;  // tokens ending here: ids_[tokens, tokens_end)
    uint32_t tokens_end = 0;
  };
  struct Trie {
    std::vector<Node> nodes;  // pre-order
    std::vector<int32_t> ids;
    size_t max_depth = 0;
  };

  size_t vocab() const { return bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const Trie& all() const { return all_; }
  // The tokens that are not plain string content.
  const Trie& rest() const { return rest_; }
  // Plain string content (whole UTF-8 characters but '"', '\\' and control
  // bytes; a bitset over ids) of at most `room` code points.
  const std::vector<uint64_t>& plain(int32_t room) const {
    return plain_[std::min(static_cast<size_t>(room), plain_.size() - 1)];
  }
  size_t words() const { return (bytes_.size() + 63) / 64; }

 private:
  std::vector<std::string> bytes_;  // per id; empty for special tokens (never masked in)
  Trie all_, rest_;
  std::vector<std::vector<uint64_t>> plain_;  // [n]: the plain tokens of at most n code points
};

// The mask of one constrained generation, step after step.
class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const TokenIndex> index, JsonMatcher& matcher);
  // Sets `allowed` (a bitset over the index's vocabulary) to the tokens whose
  // bytes the matcher accepts next.
  void compute(std::vector<uint64_t>& allowed);

 private:
  void walk(const TokenIndex::Trie& trie, std::vector<uint64_t>& allowed);
  std::shared_ptr<const TokenIndex> index_;
  JsonMatcher* matcher_;
  std::vector<MatchState> states_;  // per trie depth
};

}  // namespace edgellm
