// Fuzzes the GGUF reader: header, metadata values (strings, arrays), tensor
// infos, alignment and data bounds; and the tokenizer and chat template a bare
// GGUF builds from its tokenizer.* metadata.
#include <cstdint>

#include "edgellm/error.h"
#include "edgellm/tokenizer.h"
#include "fuzz_util.h"
#include "io/gguf.h"

volatile uint32_t g_sink;  // keeps the reads below from being optimised away

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  fuzz::write_file("model.gguf", data, size);
  try {
    const GgufFile g = GgufFile::open(fuzz::scratch_dir() / "model.gguf");
    // Read each accepted tensor's first and last byte: ASan flags any view the
    // validation let point outside the mapping.
    uint32_t sum = 0;
    for (const auto& [name, t] : g.tensors())
      if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];
    for (const auto& [key, v] : g.metadata())
      if (v.type == GgufValue::Type::array)
        sum += static_cast<uint32_t>(v.elem == GgufValue::Type::string
                                         ? g.get_string_array(key).size()
                                         : g.get_number_array(key).size());
    g_sink = sum;
  } catch (const Error&) {
    return 0;
  }
  try {
    const auto path = fuzz::scratch_dir() / "model.gguf";
    const Tokenizer t = Tokenizer::from_gguf(path);
    g_sink = static_cast<uint32_t>(t.encode("Hello, world! 123 \xC3\xA9", true).size());
    g_sink = static_cast<uint32_t>(ChatTemplate::from_gguf(path).name().size());
  } catch (const Error&) {
  }
  return 0;
}
