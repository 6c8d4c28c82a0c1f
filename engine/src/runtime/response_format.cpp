// OpenAI's response_format -> a grammar (or none), for the C++ server, the
// Python binding and, through it, the Ray ingress.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "edgellm/json_file.h"
#include "edgellm/json_grammar.h"

namespace edgellm {

namespace {
[[noreturn]] void malformed(const std::string& message) {
  throw JsonSchemaError("response_format", "response_format: " + message);
}
}  // namespace

std::shared_ptr<const JsonGrammar> response_format_grammar(std::string_view response_format) {
  using json = nlohmann::ordered_json;  // the schema's properties keep the client's order
  json rf;
  try {  // bounded nesting: dump() below recurses once per level
    rf = parse_ordered_json(response_format, "response_format");
  } catch (const Error& e) {
    throw JsonSchemaError("response_format", e.what());
  }
  if (!rf.is_object() || !rf.contains("type") || !rf.at("type").is_string())
    malformed("expected an object with a string 'type'");
  const std::string type = rf.at("type").get<std::string>();
  const auto only = [&](std::initializer_list<const char*> fields, const json& object,
                        const std::string& where) {
    for (const auto& [name, value] : object.items())
      if (std::find(fields.begin(), fields.end(), name) == fields.end())
        malformed("unsupported field '" + where + name + "'");
  };
  if (type == "text") {
    only({"type"}, rf, "");
    return nullptr;
  }
  if (type == "json_object") {
    only({"type"}, rf, "");
    return any_json_object();
  }
  if (type != "json_schema")
    malformed("'type' must be text, json_object or json_schema (got '" + type + "')");
  only({"type", "json_schema"}, rf, "");
  if (!rf.contains("json_schema") || !rf.at("json_schema").is_object())
    malformed("json_schema: expected an object with a 'schema'");
  const json& js = rf.at("json_schema");
  only({"name", "schema", "strict", "description"}, js, "json_schema.");
  if (js.contains("strict") && !js.at("strict").is_boolean() && !js.at("strict").is_null())
    malformed("json_schema.strict must be a boolean");
  for (const char* key : {"name", "description"})
    if (js.contains(key) && !js.at(key).is_string() && !js.at(key).is_null())
      malformed(std::string("json_schema.") + key + " must be a string");
  if (!js.contains("schema") || js.at("schema").is_null())
    malformed("json_schema.schema is required");
  try {
    return compile_json_schema(js.at("schema").dump());
  } catch (const JsonSchemaError& e) {
    throw JsonSchemaError(e.construct(), "response_format: " + std::string(e.what()));
  }
}

}  // namespace edgellm
