// Fuzzes config.json parsing and validation.
#include <cstdint>

#include "edgellm/config.h"
#include "edgellm/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  fuzz::write_file("config.json", data, size);
  try {
    load_model_config(fuzz::scratch_dir() / "config.json");
  } catch (const Error&) {
  }
  return 0;
}
