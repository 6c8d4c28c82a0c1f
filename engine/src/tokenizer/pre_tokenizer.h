// tokenizer.json "pre_tokenizer": splits normalized text into the pieces the
// model tokenizes independently (HF pre_tokenizers/*.rs).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "json_util.h"

namespace edgellm::tok {

struct Piece {
  std::string text;
  // Starts at byte 0 of the caller's input: Metaspace's prepend_scheme
  // "first" only prepends there.
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its sub-pieces, in order; empty pieces are dropped.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};

// nullptr for a null pre-tokenizer. Unsupported types throw Error naming them.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where);

}  // namespace edgellm::tok
