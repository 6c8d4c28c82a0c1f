#include "added_vocabulary.h"

#include "unicode.h"

namespace edgellm::tok {

void AddedVocabulary::Trie::insert(std::string_view s, int32_t index) {
  uint32_t node = 0;
  for (unsigned char c : s) {
    auto it = children[node].find(c);
    if (it == children[node].end()) {
      const auto child = static_cast<uint32_t>(children.size());
      children[node][c] = child;
      children.emplace_back();
      token.push_back(-1);
      node = child;
    } else {
      node = it->second;
    }
  }
  token[node] = index;
}

std::pair<int32_t, size_t> AddedVocabulary::Trie::longest_at(std::string_view s, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  uint32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    auto it = children[node].find(static_cast<unsigned char>(s[i]));
    if (it == children[node].end()) break;
    node = it->second;
    if (token[node] >= 0) best = {token[node], i + 1};
  }
  return best;
}

void AddedVocabulary::load(const json& list, const std::string& where,
                           const Normalizer* normalizer) {
  if (list.is_null()) return;
  if (!list.is_array()) fail(where, std::string("expected a list, found ") + type_name(list));
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string w = at_index(where, i);
    const json& t = list[i];
    AddedToken a;
    a.id = as_id(require_field(t, "id", w), at_key(w, "id"));
    a.content = string_field(t, "content", w);
    a.single_word = bool_field(t, "single_word", false, w);
    a.lstrip = bool_field(t, "lstrip", false, w);
    a.rstrip = bool_field(t, "rstrip", false, w);
    a.special = bool_field(t, "special", false, w);
    a.normalized = bool_field(t, "normalized", !a.special, w);
    if (a.content.empty()) continue;  // HF ignores empty added tokens
    if (!is_valid_utf8(a.content)) fail(at_key(w, "content"), "is not valid UTF-8");
    a.match_text = a.content;
    if (a.normalized && normalizer) normalizer->normalize(a.match_text);
    // A later entry with the same id replaces the earlier one, as in HF.
    if (auto it = by_id_.find(a.id); it != by_id_.end()) {
      tokens_[it->second] = std::move(a);
    } else {
      by_id_[a.id] = tokens_.size();
      tokens_.push_back(std::move(a));
    }
  }
  // HF builds its matchers from the id -> token map, so a content listed under
  // two ids matches the later-inserted id; inserting in list order gives that.
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& a = tokens_[i];
    if (a.match_text.empty()) continue;
    (a.normalized ? normalized_trie_ : raw_trie_).insert(a.match_text, static_cast<int32_t>(i));
    (a.normalized ? has_normalized_ : has_raw_) = true;
  }
}

void AddedVocabulary::split(std::vector<Segment>& segments, bool normalized_tokens) const {
  if (normalized_tokens ? !has_normalized_ : !has_raw_) return;
  const Trie& trie = normalized_tokens ? normalized_trie_ : raw_trie_;
  std::vector<Segment> out;
  out.reserve(segments.size());
  for (const Segment& seg : segments) {
    if (seg.token >= 0) {
      out.push_back(seg);
    } else {
      split_one(seg, trie, out);
    }
  }
  segments = std::move(out);
}

// AddedVocabulary::find_matches: leftmost-longest matches, then the
// single_word / lstrip / rstrip adjustments.
void AddedVocabulary::split_one(const Segment& seg, const Trie& trie,
                                std::vector<Segment>& out) const {
  const std::string& s = seg.text;
  auto push_text = [&](size_t b, size_t e) {
    if (e > b) out.push_back({s.substr(b, e - b), -1, seg.at_origin && b == 0});
  };
  auto is_word_char_at = [&](size_t pos) {
    size_t end = pos;
    next_codepoint(s, end);
    return word_char_.search(std::string_view(s).substr(pos, end - pos));
  };
  auto last_char_start = [&](size_t end) {
    size_t p = end - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    return p;
  };
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    const auto [index, match_end] = trie.longest_at(s, pos);
    if (index < 0) {
      pos += 1;
      continue;
    }
    const AddedToken& tok = tokens_[index];
    size_t start = pos, stop = match_end;
    pos = match_end;  // the matcher resumes after the match, used or not
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char_at(last_char_start(start));
      const bool stop_space = stop == s.size() || !is_word_char_at(stop);
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t p = last_char_start(new_start);
        size_t q = p;
        if (!is_white_space(next_codepoint(s, q))) break;
        new_start = p;
      }
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!is_white_space(next_codepoint(s, q))) break;
        stop = q;
      }
    }
    push_text(start_offset, start);
    out.push_back({s.substr(start, stop - start), tok.id, seg.at_origin && start == 0});
    start_offset = stop;
  }
  push_text(start_offset, s.size());
}

}  // namespace edgellm::tok
