#include "added_vocabulary.h"

#include "unicode.h"

namespace edgellm::tok {

void AddedVocabulary::Trie::insert(std::string_view s, int32_t id) {
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
  token[node] = id;
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

void AddedVocabulary::load(const json& list, const std::string& where, const Normalizer* normalizer,
                           const Model& model) {
  if (list.is_null()) return;
  if (!list.is_array()) fail(where, std::string("expected a list, found ") + type_name(list));
  int32_t next_id = static_cast<int32_t>(model.vocab_entries());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string w = at_index(where, i);
    const json& t = list[i];
    as_id(require_field(t, "id", w), at_key(w, "id"));  // validated, then ignored as HF does
    AddedToken a;
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
    int32_t id = id_of(a.content);
    if (id < 0) id = model.token_to_id(a.content);
    if (id < 0) id = next_id++;
    by_content_[a.content] = id;
    if (a.special) specials_.insert(a.content);
    by_id_[id] = std::move(a);
  }
  for (const auto& [id, a] : by_id_) {
    (a.normalized ? normalized_trie_ : raw_trie_).insert(a.match_text, id);
    (a.normalized ? has_normalized_ : has_raw_) = true;
  }
}

void AddedVocabulary::split(std::vector<Segment>& segments, bool normalized_tokens,
                            std::span<const std::pair<size_t, size_t>> plain) const {
  if (normalized_tokens ? !has_normalized_ : !has_raw_) return;
  const Trie& trie = normalized_tokens ? normalized_trie_ : raw_trie_;
  std::vector<Segment> out;
  out.reserve(segments.size());
  for (const Segment& seg : segments) {
    if (seg.token >= 0) {
      out.push_back(seg);
    } else {
      split_one(seg, trie, plain, out);
    }
  }
  segments = std::move(out);
}

// AddedVocabulary::find_matches: leftmost-longest matches, then the
// single_word / lstrip / rstrip adjustments.
void AddedVocabulary::split_one(const Segment& seg, const Trie& trie,
                                std::span<const std::pair<size_t, size_t>> plain,
                                std::vector<Segment>& out) const {
  const std::string& s = seg.text;
  auto push_text = [&](size_t b, size_t e) {
    if (e > b)
      out.push_back({s.substr(b, e - b), -1, seg.at_origin && b == 0, seg.offset + b, seg.plain});
  };
  // Text the caller wants read as text (e.g. a user's chat message) cannot
  // produce the special tokens that structure the conversation.
  auto in_plain = [&](size_t b, size_t e) {
    if (seg.plain) return true;
    for (const auto& [pb, pe] : plain)
      if (seg.offset + b < pe && pb < seg.offset + e) return true;
    return false;
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
    const auto [id, match_end] = trie.longest_at(s, pos);
    if (id < 0) {
      pos += 1;
      continue;
    }
    const AddedToken& tok = by_id_.find(id)->second;
    if (tok.special && in_plain(pos, match_end)) {
      pos += 1;
      continue;
    }
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
    out.push_back(
        {s.substr(start, stop - start), id, seg.at_origin && start == 0, seg.offset + start});
    start_offset = stop;
  }
  push_text(start_offset, s.size());
}

}  // namespace edgellm::tok
