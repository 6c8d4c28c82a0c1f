// Fuzzes tokenizer.json loading, then encodes and decodes a fixed text with
// whatever tokenizer was accepted.
#include <cstdint>

#include "edgellm/error.h"
#include "edgellm/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  fuzz::write_file("tokenizer.json", data, size);
  try {
    const Tokenizer t = Tokenizer::load(fuzz::scratch_dir());
    const auto ids = t.encode("Hello, world! 123 <|im_end|> caf\xC3\xA9 \xF0\x9F\x98\x80  x", true);
    t.decode(ids, false);
    t.decode(ids, true);
  } catch (const Error&) {
  }
  return 0;
}
