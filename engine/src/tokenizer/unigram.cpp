// Unigram language-model tokenization (HF models/unigram, "encode_optimized"):
// Viterbi over all vocabulary pieces that match at each byte position, scored
// by the pieces' log probabilities. Characters no piece covers become <unk>
// (scored min_score - 10, consecutive ones fused), then <0xNN> byte tokens
// when byte_fallback is set. Gemma checkpoints converted from GGUF use this.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <numeric>

#include "model.h"
#include "unicode.h"

namespace edgellm::tok {

namespace {

constexpr double kUnkPenalty = 10.0;

// Byte trie over the vocabulary, children stored contiguously and sorted so
// a lookup is a binary search; ~12 bytes per node keeps a 262k-piece
// vocabulary in a few tens of MB.
class Trie {
 public:
  void build(const std::vector<std::string>& keys, const std::vector<int32_t>& values);
  // Calls fn(length, value) for every key that is a prefix of s, shortest first.
  template <typename Fn>
  void common_prefixes(std::string_view s, Fn&& fn) const {
    uint32_t node = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const Node& n = nodes_[node];
      const auto* begin = edges_.data() + n.first_edge;
      const auto* end = begin + n.edge_count;
      const auto byte = static_cast<unsigned char>(s[i]);
      const auto* e = std::lower_bound(begin, end, byte,
                                       [](const Edge& x, unsigned char b) { return x.byte < b; });
      if (e == end || e->byte != byte) return;
      node = e->child;
      if (nodes_[node].value >= 0) fn(i + 1, nodes_[node].value);
    }
  }

 private:
  struct Node {
    int32_t value = -1;
    uint32_t first_edge = 0;
    uint32_t edge_count = 0;
  };
  struct Edge {
    unsigned char byte;
    uint32_t child;
  };
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
};

void Trie::build(const std::vector<std::string>& keys, const std::vector<int32_t>& values) {
  std::vector<uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  // std::string orders bytes as unsigned char, so each node's edges come out sorted.
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  nodes_.assign(1, Node{});
  edges_.clear();
  // Iterative, not recursive: a piece is file content, and a 200 KB piece
  // would otherwise recurse 200k frames deep. Each pending node owns the keys
  // order[lo, hi), which share their first `depth` bytes.
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Pending> stack{{0, 0, order.size(), 0}};
  while (!stack.empty()) {
    auto [self, lo, hi, depth] = stack.back();
    stack.pop_back();
    // Keys ending here sort first; duplicates keep the last value, like HF's
    // token -> id map, which the caller already resolved into `values`.
    while (lo < hi && keys[order[lo]].size() == depth) nodes_[self].value = values[order[lo++]];
    const auto first = static_cast<uint32_t>(edges_.size());
    for (size_t i = lo; i < hi;) {
      const char b = keys[order[i]][depth];
      size_t j = i;
      while (j < hi && keys[order[j]][depth] == b) ++j;
      const auto child = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
      edges_.push_back({static_cast<unsigned char>(b), child});
      stack.push_back({child, i, j, depth + 1});
      i = j;
    }
    nodes_[self].first_edge = first;
    nodes_[self].edge_count = static_cast<uint32_t>(edges_.size()) - first;
  }
}

class Unigram final : public Model {
 public:
  Unigram(const json& j, const std::string& where);

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override;
  int32_t token_to_id(std::string_view token) const override {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
    return &pieces_[id];
  }
  size_t id_count() const override { return pieces_.size(); }
  size_t vocab_entries() const override { return pieces_.size(); }

 private:
  void encode(std::string_view s, std::vector<int32_t>& out) const;

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  TokenMap vocab_;
  Trie trie_;
  double min_score_ = 0;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_;

  WordCache cache_;
};

Unigram::Unigram(const json& j, const std::string& where) {
  const std::string vw = at_key(where, "vocab");
  const json& vocab = require_field(j, "vocab", where);
  if (!vocab.is_array()) fail(vw, std::string("expected a list, found ") + type_name(vocab));
  if (vocab.empty()) fail(vw, "is empty");
  pieces_.reserve(vocab.size());
  scores_.reserve(vocab.size());
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab.size(); ++i) {
    const json& e = vocab[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number() ||
        !std::isfinite(e[1].get<double>()))
      fail(at_index(vw, i), "expected [piece, score] with a finite score");
    pieces_.push_back(e[0].get<std::string>());
    scores_.push_back(e[1].get<double>());
    min_score_ = std::min(min_score_, scores_.back());
    vocab_[pieces_.back()] = static_cast<int32_t>(i);  // a repeated piece maps to its last id
  }
  if (const json* u = find_field(j, "unk_id")) {
    unk_id_ = as_id(*u, at_key(where, "unk_id"));
    if (static_cast<size_t>(unk_id_) >= pieces_.size())
      fail(at_key(where, "unk_id"), "is larger than the vocabulary");
  }
  byte_fallback_ = bool_field(j, "byte_fallback", false, where);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }
  std::vector<int32_t> values(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) values[i] = vocab_.find(pieces_[i])->second;
  trie_.build(pieces_, values);
}

void Unigram::encode(std::string_view s, std::vector<int32_t>& out) const {
  struct Best {
    double score = 0;
    int32_t id = -1;
    int32_t start = -1;  // -1: not reached yet
  };
  const double unk_score = min_score_ - kUnkPenalty;
  std::vector<Best> best(s.size() + 1);
  for (size_t start = 0; start < s.size();) {
    const double base = best[start].score;
    const size_t char_len =
        std::min(utf8_len(static_cast<unsigned char>(s[start])), s.size() - start);
    bool has_single = false;
    trie_.common_prefixes(s.substr(start), [&](size_t len, int32_t id) {
      Best& t = best[start + len];
      const double cand = base + scores_[id];
      // Strictly greater: on ties the shorter piece, found first, stays.
      if (t.start < 0 || cand > t.score) t = {cand, id, static_cast<int32_t>(start)};
      if (len == char_len) has_single = true;
    });
    if (!has_single) {
      if (unk_id_ < 0)
        throw Error("tokenizer.json: Unigram model met an unknown character but has no unk_id");
      Best& t = best[start + char_len];
      const double cand = base + unk_score;
      if (t.start < 0 || cand > t.score) t = {cand, unk_id_, static_cast<int32_t>(start)};
    }
    start += char_len;
  }

  // Walk back, fusing consecutive unk nodes into one string as HF does.
  struct Node {
    size_t begin, end;
    int32_t id;  // -1: fused unk text
  };
  std::vector<Node> path;
  for (size_t end = s.size(); end > 0;) {
    const Best& b = best[end];
    const auto begin = static_cast<size_t>(b.start);
    if (b.id == unk_id_) {
      if (!path.empty() && path.back().id == -1 && path.back().begin == end) {
        path.back().begin = begin;
      } else {
        path.push_back({begin, end, -1});
      }
    } else {
      path.push_back({begin, end, b.id});
    }
    end = begin;
  }
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    if (it->id >= 0) {
      out.push_back(it->id);
      continue;
    }
    // Unigram::tokenize: a fused unk string that happens to be a piece is that
    // piece; otherwise bytes when all <0xNN> exist; otherwise unk.
    const std::string_view text = s.substr(it->begin, it->end - it->begin);
    if (const int32_t id = token_to_id(text); id >= 0) {
      out.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : text) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : text) out.push_back(byte_ids_[c]);
        continue;
      }
    }
    out.push_back(unk_id_);
  }
}

void Unigram::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  cache_.tokenize(piece, out,
                  [&](std::string_view word, std::vector<int32_t>& ids) { encode(word, ids); });
}

}  // namespace

std::unique_ptr<Model> make_unigram(const json& j, const std::string& where) {
  return std::make_unique<Unigram>(j, where);
}

}  // namespace edgellm::tok
