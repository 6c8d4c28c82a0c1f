// tokenizer.json "model": turns one pre-tokenized piece into ids.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "json_util.h"

namespace edgellm::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// string -> id map that can be probed with a string_view without allocating.
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// HF's per-word cache: words shorter than 256 bytes, up to 10000 of them, so
// repeated words cost one lookup. Thread-safe; shared by the BPE and Unigram models.
class WordCache {
 public:
  // Appends the ids of `word` to `out`: cached, or computed by encode(word, ids).
  template <typename Encode>
  void tokenize(std::string_view word, std::vector<int32_t>& out, Encode&& encode) const {
    const bool cacheable = word.size() < kMaxWordBytes;
    if (cacheable) {
      std::lock_guard lock(mutex_);
      if (auto it = map_.find(word); it != map_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    encode(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      std::lock_guard lock(mutex_);
      if (map_.size() < kCapacity) map_.emplace(std::string(word), std::move(ids));
    }
  }

 private:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kCapacity = 10000;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map_;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `piece` (non-empty, valid UTF-8) to `out`.
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& out) const = 0;
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 when absent
  virtual const std::string* id_to_token(int32_t id) const = 0;   // nullptr when absent
  // One past the largest id.
  virtual size_t id_count() const = 0;
  // Entries in the vocabulary (HF Model::get_vocab_size); added tokens the
  // model lacks get ids from here on.
  virtual size_t vocab_entries() const = 0;
};

// A BPE model's contents, however they were stored (tokenizer.json, GGUF metadata).
struct BpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;       // token, id
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, best first
  std::optional<std::string> unk_token;
  std::string continuing_prefix, end_suffix;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
};

std::unique_ptr<Model> make_bpe(const json& j, const std::string& where);
// `where` prefixes error messages (e.g. "file: model").
std::unique_ptr<Model> make_bpe(BpeSpec spec, const std::string& where);
std::unique_ptr<Model> make_unigram(const json& j, const std::string& where);

// Dispatches on model.type; unsupported types throw Error naming them.
std::unique_ptr<Model> make_model(const json& j, const std::string& where);

}  // namespace edgellm::tok
