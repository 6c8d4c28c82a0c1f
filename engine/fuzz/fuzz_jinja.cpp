// Fuzzes the Jinja interpreter on its own: the input is a template (untrusted:
// it comes inside a downloaded model), parsed and rendered with a conversation
// that reaches the paths real templates take (system, tools, tool calls and
// results, a generation prompt). Every failure must be a TemplateError; the
// limits (smaller than a real render's, for speed) keep a hostile template's
// output, live bytes, work in bytes, steps and nesting bounded, and any
// std::bad_alloc, length_error or stack overflow escaping them is a finding.
#include <cstdint>
#include <string_view>

#include "edgellm/jinja.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = [] {
    edgellm::jinja::ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": " Hi <|im_end|> "},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C"},
      {"role": "assistant", "content": "It is 18 C.", "reasoning_content": "easy"},
      {"role": "user", "content": "Bye"}])");
    in.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Weather.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    in.add_generation_prompt = true;
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    in.extra = {{"enable_thinking", false}};
    return edgellm::jinja::chat_context(in);
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace j = edgellm::jinja;
  j::Options options;
  options.now = 0;
  options.limits.max_output = size_t{1} << 20;
  options.limits.max_memory = size_t{8} << 20;
  options.limits.max_work = size_t{64} << 20;
  options.limits.max_steps = 200'000;
  try {
    const j::Template t =
        j::Template::parse(std::string_view(reinterpret_cast<const char*>(data), size), options);
    (void)t.render(context());
  } catch (const j::TemplateError&) {
  }
  return 0;
}
