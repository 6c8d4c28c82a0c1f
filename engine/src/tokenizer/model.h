// tokenizer.json "model": turns one pre-tokenized piece into ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_util.h"

namespace edgellm::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// string -> id map that can be probed with a string_view without allocating.
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

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

std::unique_ptr<Model> make_bpe(const json& j, const std::string& where);
std::unique_ptr<Model> make_unigram(const json& j, const std::string& where);

// Dispatches on model.type; unsupported types throw Error naming them.
std::unique_ptr<Model> make_model(const json& j, const std::string& where);

}  // namespace edgellm::tok
