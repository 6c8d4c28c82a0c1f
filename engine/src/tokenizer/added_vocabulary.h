// tokenizer.json "added_tokens": strings matched in the text before any model
// sees it (HF tokenizer/added_vocabulary.rs). Tokens with normalized=false are
// found in the raw input; the others in each normalized stretch between those.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "json_util.h"
#include "model.h"
#include "normalizer.h"
#include "regex.h"

namespace edgellm::tok {

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  std::string match_text;  // content, normalized when `normalized`
};

// A stretch of input: either text still to tokenize or one added token.
struct Segment {
  std::string text;
  int32_t token = -1;
  bool at_origin = false;  // starts at byte 0 of the input
  size_t offset = 0;       // where it starts in the input (before normalization)
  bool plain = false;      // overlaps a plain span: no special token is matched in it
};

class AddedVocabulary {
 public:
  // Ids are assigned the way HF deserialises the list: a content the model
  // already knows keeps the model's id, the others count up from the model's
  // vocabulary size. The "id" written in the file is not used (HF only warns
  // when it differs).
  void load(const json& list, const std::string& where, const Normalizer* normalizer,
            const Model& model);

  // Splits each text segment around the matches of the raw (normalized=false)
  // or the normalized tokens. A special token is not matched where it overlaps
  // one of the `plain` byte ranges of the input (raw pass) or in a segment
  // marked plain (normalized pass).
  void split(std::vector<Segment>& segments, bool normalized_tokens,
             std::span<const std::pair<size_t, size_t>> plain = {}) const;

  const AddedToken* by_id(int32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }
  int32_t id_of(std::string_view content) const {
    auto it = by_content_.find(content);
    return it == by_content_.end() ? -1 : it->second;
  }
  // HF skips a decoded token whose string is the content of a special token.
  bool is_special_content(const std::string& token) const { return specials_.contains(token); }
  int32_t max_id() const { return by_id_.empty() ? -1 : by_id_.rbegin()->first; }

 private:
  // Byte trie over match_text of one group, for leftmost-longest matching.
  struct Trie {
    std::vector<std::unordered_map<unsigned char, uint32_t>> children{1};
    std::vector<int32_t> token{-1};  // token id, -1 when none ends here
    void insert(std::string_view s, int32_t index);
    // Longest token starting at s[pos]: {id, end}, or {-1, 0}.
    std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const;
  };
  void split_one(const Segment& seg, const Trie& trie,
                 std::span<const std::pair<size_t, size_t>> plain, std::vector<Segment>& out) const;

  std::map<int32_t, AddedToken> by_id_;
  TokenMap by_content_;
  std::unordered_set<std::string> specials_;
  Trie raw_trie_, normalized_trie_;
  bool has_raw_ = false, has_normalized_ = false;
  Regex word_char_{R"(^\w$)", "added_tokens"};
};

}  // namespace edgellm::tok
