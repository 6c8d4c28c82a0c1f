#include "runtime/token_mask.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>

namespace edgellm {

namespace {

// Plain string content: whole UTF-8 characters, none of them '"', '\\' or a
// control byte; each keeps a string between characters, adding one code
// point. The ranges are json_matcher.cpp's (no overlong forms, no surrogates,
// nothing above U+10FFFF). Returns the code points, or -1.
int plain_code_points(std::string_view bytes) {
  int n = 0;
  for (size_t i = 0; i < bytes.size(); ++n) {
    const auto c = static_cast<uint8_t>(bytes[i++]);
    if (c < 0x80) {
      if (c < 0x20 || c == '"' || c == '\\') return -1;
      continue;
    }
    uint8_t lo = 0x80, hi = 0xBF;
    size_t more = 0;
    if (c >= 0xC2 && c <= 0xDF)
      more = 1;
    else if (c == 0xE0)
      more = 2, lo = 0xA0;
    else if (c == 0xED)
      more = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
      more = 2;
    else if (c == 0xF0)
      more = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      more = 3;
    else if (c == 0xF4)
      more = 3, hi = 0x8F;
    else
      return -1;
    for (; more > 0; --more, lo = 0x80, hi = 0xBF) {
      if (i >= bytes.size()) return -1;  // a character the next token completes
      const auto b = static_cast<uint8_t>(bytes[i++]);
      if (b < lo || b > hi) return -1;
    }
  }
  return n;
}

// The pre-order trie of `ids` (sorted by their bytes).
TokenIndex::Trie build_trie(std::vector<int32_t> ids, const std::vector<std::string>& bytes) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes[static_cast<size_t>(a)] != bytes[static_cast<size_t>(b)]
               ? bytes[static_cast<size_t>(a)] < bytes[static_cast<size_t>(b)]
               : a < b;
  });
  TokenIndex::Trie t;
  std::vector<uint32_t> open;  // the nodes on the path to the previous string
  const std::string* prev = nullptr;
  for (const int32_t id : ids) {
    const std::string& s = bytes[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    while (open.size() > common) {
      t.nodes[open.back()].end = static_cast<uint32_t>(t.nodes.size());
      open.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      TokenIndex::Node n;
      n.byte = static_cast<uint8_t>(s[d]);
      n.depth = static_cast<uint16_t>(d + 1);
      n.tokens = n.tokens_end = static_cast<uint32_t>(t.ids.size());
      open.push_back(static_cast<uint32_t>(t.nodes.size()));
      t.nodes.push_back(n);
    }
    // Ids sorted by bytes: those ending at a node are consecutive.
    TokenIndex::Node& last = t.nodes[open.back()];
    if (last.tokens_end != t.ids.size()) last.tokens = static_cast<uint32_t>(t.ids.size());
    t.ids.push_back(id);
    last.tokens_end = static_cast<uint32_t>(t.ids.size());
    t.max_depth = std::max(t.max_depth, s.size());
    prev = &s;
  }
  while (!open.empty()) {
    t.nodes[open.back()].end = static_cast<uint32_t>(t.nodes.size());
    open.pop_back();
  }
  return t;
}

std::atomic<size_t> g_builds{0};

}  // namespace

void warm_grammar_index(const Tokenizer& tokenizer) {
  TokenIndex::of(tokenizer);
}

size_t grammar_index_builds() {
  return g_builds.load();
}

TokenIndex::TokenIndex(const Tokenizer& tokenizer) {
  ++g_builds;
  const size_t vocab = tokenizer.vocab_size();
  bytes_.resize(vocab);
  std::vector<int32_t> all, rest;
  std::vector<std::pair<int32_t, int>> plain;  // id, code points
  for (size_t i = 0; i < vocab; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (tokenizer.is_special(id)) continue;
    bytes_[i] = tokenizer.token_bytes(id);
    if (bytes_[i].empty()) continue;
    all.push_back(id);
    if (const int n = plain_code_points(bytes_[i]); n > 0)
      plain.emplace_back(id, n);
    else
      rest.push_back(id);
  }
  int longest = 0;
  for (const auto& [id, n] : plain) longest = std::max(longest, n);
  plain_.assign(static_cast<size_t>(longest) + 1, std::vector<uint64_t>(words(), 0));
  for (const auto& [id, n] : plain)
    for (int room = n; room <= longest; ++room)
      plain_[static_cast<size_t>(room)][static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  all_ = build_trie(std::move(all), bytes_);
  rest_ = build_trie(std::move(rest), bytes_);
}

std::shared_ptr<const TokenIndex> TokenIndex::of(const Tokenizer& tokenizer) {
  // Keyed by the tokenizer's address, checked against its vocabulary size and a
  // sample of token bytes in case another tokenizer reuses the address.
  struct Entry {
    const Tokenizer* tokenizer;
    std::shared_ptr<const TokenIndex> index;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;
  const auto same = [&](const TokenIndex& index) {
    if (index.vocab() != tokenizer.vocab_size()) return false;
    for (size_t i = 0; i < index.vocab(); i += 997) {
      const auto id = static_cast<int32_t>(i);
      if (!tokenizer.is_special(id) && index.bytes(id) != tokenizer.token_bytes(id)) return false;
    }
    return true;
  };
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache)
    if (e.tokenizer == &tokenizer && same(*e.index)) return e.index;
  std::erase_if(cache, [&](const Entry& e) { return e.tokenizer == &tokenizer; });
  if (cache.size() >= 8) cache.erase(cache.begin());
  cache.push_back({&tokenizer, std::make_shared<const TokenIndex>(tokenizer)});
  return cache.back().index;
}

TokenMasker::TokenMasker(std::shared_ptr<const TokenIndex> index, JsonMatcher& matcher)
    : index_(std::move(index)), matcher_(&matcher) {
  states_.resize(index_->all().max_depth + 1);
}

void TokenMasker::compute(std::vector<uint64_t>& allowed) {
  if (const int32_t room = matcher_->string_room(); room >= 0) {
    // Inside a string the plain tokens that fit are allowed wholesale; only
    // the others are walked.
    allowed = index_->plain(room);
    walk(index_->rest(), allowed);
  } else {
    allowed.assign(index_->words(), 0);
    walk(index_->all(), allowed);
  }
}

void TokenMasker::walk(const TokenIndex::Trie& trie, std::vector<uint64_t>& allowed) {
  states_[0] = matcher_->state();
  const std::vector<TokenIndex::Node>& nodes = trie.nodes;
  for (size_t i = 0; i < nodes.size();) {
    const TokenIndex::Node& n = nodes[i];
    MatchState& here = states_[n.depth];
    matcher_->step(states_[n.depth - 1u], n.byte, here);
    if (here.dead()) {
      i = n.end;
      continue;
    }
    for (uint32_t t = n.tokens; t < n.tokens_end; ++t) {
      const auto id = static_cast<size_t>(trie.ids[t]);
      allowed[id / 64] |= uint64_t{1} << (id % 64);
    }
    ++i;
  }
}

}  // namespace edgellm
