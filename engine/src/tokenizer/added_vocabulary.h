// tokenizer.json "added_tokens": strings matched in the text before any model
// sees it (HF tokenizer/added_vocabulary.rs). Tokens with normalized=false are
// found in the raw input; the others in each normalized stretch between those.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_util.h"
#include "normalizer.h"
#include "regex.h"

namespace edgellm::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  std::string match_text;  // content, normalized when `normalized`
};

// A stretch of input: either text still to tokenize or one added token.
struct Segment {
  std::string text;
  int32_t token = -1;
  bool at_origin = false;  // starts at byte 0 of the input
};

class AddedVocabulary {
 public:
  void load(const json& list, const std::string& where, const Normalizer* normalizer);

  // Splits each text segment around the matches of the raw (normalized=false)
  // or the normalized tokens.
  void split(std::vector<Segment>& segments, bool normalized_tokens) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* by_id(int32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }

 private:
  // Byte trie over match_text of one group, for leftmost-longest matching.
  struct Trie {
    std::vector<std::unordered_map<unsigned char, uint32_t>> children{1};
    std::vector<int32_t> token{-1};  // index into tokens_, -1 when none ends here
    void insert(std::string_view s, int32_t index);
    // Longest token starting at s[pos]: {index, end}, or {-1, 0}.
    std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const;
  };
  void split_one(const Segment& seg, const Trie& trie, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  Trie raw_trie_, normalized_trie_;
  bool has_raw_ = false, has_normalized_ = false;
  Regex word_char_{R"(^\w$)", "added_tokens"};
};

}  // namespace edgellm::tok
