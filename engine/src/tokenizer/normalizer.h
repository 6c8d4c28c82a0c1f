// tokenizer.json "normalizer": rewrites text before pre-tokenization (HF
// normalizers/*.rs). Only the string matters here; HF's offset alignments are
// not needed to produce ids.
#pragma once

#include <memory>
#include <string>

#include "json_util.h"

namespace edgellm::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a null normalizer. Unsupported types throw Error naming them.
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where);

}  // namespace edgellm::tok
