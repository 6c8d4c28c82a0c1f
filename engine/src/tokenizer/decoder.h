// tokenizer.json "decoder": turns token strings back into text (HF
// decoders/*.rs). Each step maps a list of strings to a list of strings; the
// result is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "json_util.h"

namespace edgellm::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // keep_bytes: bytes that are not valid UTF-8 stay as they are (one token's
  // part of a character) instead of HF's U+FFFD.
  virtual void decode_chain(std::vector<std::string>& tokens, bool keep_bytes) const = 0;
};

// nullptr for a null decoder (HF then joins the tokens with spaces).
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where);

}  // namespace edgellm::tok
