// Fuzzes chat-template loading and rendering: an input starting with '{' is
// taken as tokenizer_config.json, anything else as chat_template.jinja.
#include <cstdint>
#include <span>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  const bool config = size > 0 && data[0] == '{';
  fuzz::remove_file(config ? "chat_template.jinja" : "tokenizer_config.json");
  fuzz::write_file(config ? "tokenizer_config.json" : "chat_template.jinja", data, size);
  try {
    const ChatTemplate t = ChatTemplate::load(fuzz::scratch_dir());
    const std::vector<ChatMessage> turns = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello "}, {"user", "Bye"}};
    t.render(turns, true);
    t.render(std::span(turns).subspan(1), false);
  } catch (const Error&) {
  }
  return 0;
}
