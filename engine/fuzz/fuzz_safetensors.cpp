// Fuzzes the safetensors header parser and its offset/shape validation.
#include <cstdint>

#include "edgellm/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

volatile uint32_t g_sink;  // keeps the reads below from being optimised away

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  fuzz::write_file("model.safetensors", data, size);
  try {
    const Checkpoint ckpt = Checkpoint::open(fuzz::scratch_dir());
    // Read each accepted tensor's first and last byte: ASan flags any view
    // the validation let point outside the mapping.
    uint32_t sum = 0;
    for (const auto& [name, t] : ckpt.tensors())
      if (t.nbytes > 0)
        sum += static_cast<const uint8_t*>(t.data)[0] +
               static_cast<const uint8_t*>(t.data)[t.nbytes - 1];
    g_sink = sum;
  } catch (const Error&) {
  }
  return 0;
}
