// Fuzzes structured output's schema compiler and matcher: the input is a
// schema, a NUL byte, then a document fed to the matcher byte by byte (each
// step on a copy, as the token mask does). A schema past JsonSchemaLimits is
// a JsonSchemaError like any refusal; a compiled grammar must keep the
// compiler's promise to the matcher (no any_of among an any_of's alternatives:
// the matcher expands one level). Seeds: ref chains (one past the depth
// limit), a self-reference through "#", integer bounds past 15 digits.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "edgellm/json_grammar.h"
#include "runtime/json_matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace edgellm;
  const auto* text = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(text, 0, size);
  const size_t schema_size = nul ? static_cast<size_t>(static_cast<const char*>(nul) - text) : size;
  const std::string_view doc =
      nul ? std::string_view(text + schema_size + 1, size - schema_size - 1) : std::string_view();
  try {
    const auto grammar = compile_json_schema(std::string_view(text, schema_size));
    for (const GrammarNode& n : grammar->nodes)
      for (const int32_t alt : n.alternatives)
        if (grammar->nodes[static_cast<size_t>(alt)].kind == GrammarKind::any_of) __builtin_trap();
    JsonMatcher m(grammar);
    MatchState next;
    for (const char c : doc) {
      m.step(m.state(), static_cast<uint8_t>(c), next);
      if (next.dead() || !m.accept(std::string_view(&c, 1))) break;
      (void)m.complete();
      (void)m.ended();
      (void)m.string_room();
    }
  } catch (const JsonSchemaError&) {
  }
  return 0;
}
