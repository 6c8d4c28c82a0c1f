// Byte-pair encoding (HF models/bpe): each piece starts as one symbol per
// character and the lowest-ranked adjacent pair is merged until none is left.
// A min-heap over (rank, position) on a doubly linked symbol list makes a word
// O(n log n), and a per-word cache makes repeated words free.
#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <queue>

#include "model.h"
#include "unicode.h"

namespace edgellm::tok {

namespace {

// Ids are dense in every real vocabulary; this bound only stops a corrupt file
// from making us allocate gigabytes for the id -> token table.
constexpr int64_t kMaxId = 1 << 24;

struct MergeInfo {
  uint32_t rank;
  int32_t new_id;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class Bpe final : public Model {
 public:
  Bpe(BpeSpec spec, const std::string& where, const std::vector<size_t>& merge_index);

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const override;
  int32_t token_to_id(std::string_view token) const override {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || !present_[id]) return nullptr;
    return &tokens_[id];
  }
  size_t id_count() const override { return tokens_.size(); }
  size_t vocab_entries() const override { return vocab_.size(); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // indices in the word, -1 at the ends
    uint32_t len;        // bytes of the piece covered; 0 once merged away
  };
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  void merge_all(std::vector<Symbol>& symbols) const;
  const MergeInfo* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  TokenMap vocab_;
  std::vector<std::string> tokens_;
  std::vector<uint8_t> present_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::string continuing_prefix_, end_suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_;  // <0xNN> tokens, -1 when absent

  WordCache cache_;
};

// tokenizer.json's "model" of type BPE, validated field by field. `merge_index`
// maps a merge to its position in the file where "#version" lines were skipped.
BpeSpec parse_bpe(const json& j, const std::string& where, std::vector<size_t>& merge_index) {
  BpeSpec spec;
  const std::string vw = at_key(where, "vocab");
  const json& vocab = require_field(j, "vocab", where);
  if (!vocab.is_object()) fail(vw, std::string("expected an object, found ") + type_name(vocab));
  spec.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    spec.vocab.emplace_back(it.key(), as_id(it.value(), at_key(vw, it.key())));
  spec.continuing_prefix = optional_string(j, "continuing_subword_prefix", where).value_or("");
  spec.end_suffix = optional_string(j, "end_of_word_suffix", where).value_or("");
  spec.fuse_unk = bool_field(j, "fuse_unk", false, where);
  spec.byte_fallback = bool_field(j, "byte_fallback", false, where);
  spec.ignore_merges = bool_field(j, "ignore_merges", false, where);
  if (const json* d = find_field(j, "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0)
      fail(at_key(where, "dropout"), "BPE dropout is random and not supported; expected null");
  }
  spec.unk_token = optional_string(j, "unk_token", where);

  const std::string mw = at_key(where, "merges");
  const json& merges = require_field(j, "merges", where);
  if (!merges.is_array()) fail(mw, std::string("expected a list, found ") + type_name(merges));
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string w = at_index(mw, i);
    if (m.is_string()) {
      // Legacy "a b" form; HF skips "#version" header lines without using a rank.
      const std::string& line = m.get_ref<const std::string&>();
      if (line.starts_with("#version")) {
        if (merge_index.empty())
          for (size_t k = 0; k < spec.merges.size(); ++k) merge_index.push_back(k);
        continue;
      }
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        fail(w, "expected \"<left> <right>\", found '" + line + "'");
      spec.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail(w, "expected \"<left> <right>\" or [left, right]");
    }
    if (!merge_index.empty()) merge_index.push_back(i);
  }
  return spec;
}

Bpe::Bpe(BpeSpec spec, const std::string& where, const std::vector<size_t>& merge_index) {
  const std::string vw = at_key(where, "vocab");
  int64_t max_id = -1;
  vocab_.reserve(spec.vocab.size());
  for (auto& [token, id] : spec.vocab) {
    if (id >= kMaxId) fail(at_key(vw, token), "token id " + std::to_string(id) + " is too large");
    max_id = std::max<int64_t>(max_id, id);
    vocab_[std::move(token)] = id;  // a repeated token keeps its last id, as in HF
  }
  tokens_.resize(static_cast<size_t>(max_id + 1));
  present_.assign(tokens_.size(), 0);
  for (const auto& [tok, id] : vocab_) {
    tokens_[id] = tok;
    present_[id] = 1;
  }

  continuing_prefix_ = std::move(spec.continuing_prefix);
  end_suffix_ = std::move(spec.end_suffix);
  fuse_unk_ = spec.fuse_unk;
  byte_fallback_ = spec.byte_fallback;
  ignore_merges_ = spec.ignore_merges;
  if (spec.unk_token) {
    unk_id_ = token_to_id(*spec.unk_token);
    if (unk_id_ < 0)
      fail(at_key(where, "unk_token"), "'" + *spec.unk_token + "' is not in the vocabulary");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }

  const std::string mw = at_key(where, "merges");
  merges_.reserve(spec.merges.size());
  uint32_t rank = 0;
  std::string joined;
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [a, b] = spec.merges[i];
    auto w = [&] { return at_index(mw, merge_index.empty() ? i : merge_index[i]); };
    const int32_t ida = token_to_id(a), idb = token_to_id(b);
    if (ida < 0) fail(w(), "merge token '" + a + "' is not in the vocabulary");
    if (idb < 0) fail(w(), "merge token '" + b + "' is not in the vocabulary");
    if (b.size() < continuing_prefix_.size())
      fail(w(), "merge token '" + b + "' lacks the continuing_subword_prefix");
    joined = a;
    joined.append(b, continuing_prefix_.size());
    const int32_t idm = token_to_id(joined);
    if (idm < 0) fail(w(), "merged token '" + joined + "' is not in the vocabulary");
    merges_[pair_key(ida, idb)] = {rank++, idm};  // a repeated pair keeps its last rank, as in HF
  }
}

// HF BPE::merge_word before merging: one symbol per character, falling back to
// <0xNN> byte tokens, then to (possibly fused) unk.
void Bpe::initial_symbols(std::string_view w, std::vector<Symbol>& symbols) const {
  auto add = [&](int32_t id, size_t len) {
    const int32_t idx = static_cast<int32_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = idx;
    symbols.push_back({id, idx - 1, -1, static_cast<uint32_t>(len)});
  };
  int32_t unk_pending = -1;
  size_t unk_len = 0;
  std::string buf;
  for (size_t pos = 0; pos < w.size();) {
    const size_t start = pos;
    pos += utf8_len(static_cast<unsigned char>(w[pos]));
    pos = std::min(pos, w.size());
    std::string_view ch = w.substr(start, pos - start);
    std::string_view s = ch;
    if (!continuing_prefix_.empty() || !end_suffix_.empty()) {
      buf.clear();
      if (start != 0) buf += continuing_prefix_;
      buf += ch;
      if (pos == w.size()) buf += end_suffix_;
      s = buf;
    }
    const int32_t id = token_to_id(s);
    if (id >= 0) {
      if (unk_pending >= 0) {
        add(unk_pending, unk_len);
        unk_pending = -1;
      }
      add(id, ch.size());
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        // HF leaves a pending unk pending here, so it lands after these bytes.
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending >= 0 && fuse_unk_) {
        unk_len += ch.size();
      } else {
        if (unk_pending >= 0) add(unk_pending, unk_len);
        unk_pending = unk_id_;
        unk_len = ch.size();
      }
    }
    // Without an unk token HF drops the character silently; so do we.
  }
  if (unk_pending >= 0) add(unk_pending, unk_len);
}

void Bpe::merge_all(std::vector<Symbol>& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeInfo* m = find_merge(symbols[i].id, symbols[i + 1].id))
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    // Stale entry: one side changed since it was queued.
    const MergeInfo* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;

    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (cur.prev >= 0) {
      if (const MergeInfo* pm = find_merge(symbols[cur.prev].id, cur.id))
        queue.push({pm->rank, cur.prev, pm->new_id});
    }
    if (cur.next >= 0) {
      if (const MergeInfo* nm = find_merge(cur.id, symbols[cur.next].id))
        queue.push({nm->rank, top.pos, nm->new_id});
    }
  }
}

void Bpe::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    // Llama 3: a piece that is itself a token is emitted whole.
    if (const int32_t id = token_to_id(piece); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  cache_.tokenize(piece, out, [&](std::string_view word, std::vector<int32_t>& ids) {
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    initial_symbols(word, symbols);
    merge_all(symbols);
    ids.reserve(symbols.size());
    for (const Symbol& sym : symbols)
      if (sym.len != 0) ids.push_back(sym.id);
  });
}

}  // namespace

std::unique_ptr<Model> make_bpe(const json& j, const std::string& where) {
  std::vector<size_t> merge_index;
  BpeSpec spec = parse_bpe(j, where, merge_index);
  return std::make_unique<Bpe>(std::move(spec), where, merge_index);
}

std::unique_ptr<Model> make_bpe(BpeSpec spec, const std::string& where) {
  return std::make_unique<Bpe>(std::move(spec), where, std::vector<size_t>{});
}

std::unique_ptr<Model> make_model(const json& j, const std::string& where) {
  const std::string type = optional_string(j, "type", where).value_or("");
  if (type == "BPE") return make_bpe(j, where);
  if (type == "Unigram") return make_unigram(j, where);
  if (type.empty()) {
    // Untyped legacy files: HF guesses from the fields present.
    if (find_field(j, "merges")) return make_bpe(j, where);
    fail(at_key(where, "type"), "missing");
  }
  fail(at_key(where, "type"), "'" + type + "' is not supported (supported: BPE, Unigram)");
}

}  // namespace edgellm::tok
