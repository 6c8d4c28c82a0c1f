// Bounded JSON parsing for every JSON file the engine and its front ends read (config.json,
// generation_config.json, the safetensors header and index, tokenizer.json,
// tokenizer_config.json). nlohmann's parser itself is iterative, but dump(),
// copies and the engine's own walks recurse once per level, so a value nested
// 100k deep would overflow the stack later. Real files nest fewer than ten
// levels; deeper ones are refused while parsing. Time is linear in the text,
// for ordered_json too (nlohmann's own ordered_json parse is quadratic in the
// keys of one object).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace edgellm {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; `source` names it in errors ("<source>: parse error at byte N: ...").
nlohmann::json parse_json(std::string_view text, const std::string& source);
// The same, keeping object keys in their written order (a JSON schema's
// properties, a tool's parameters): use it, not ordered_json::parse, on untrusted text.
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& source);

// Reads and parses a whole file; errors name the path.
nlohmann::json read_json_file(const std::filesystem::path& path);

// A value quoted in an error message: compact JSON, cut to `max_chars`.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 60);

}  // namespace edgellm
