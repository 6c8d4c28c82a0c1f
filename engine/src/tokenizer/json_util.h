// Typed access to tokenizer.json / tokenizer_config.json fields. Every error
// names the file and the JSON path ("tokenizer.json: model.merges[12]: ...")
// so a corrupt file is reported, never dereferenced.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "edgellm/error.h"

namespace edgellm::tok {

using nlohmann::json;

// `where` is "<file>: <json path>"; these helpers extend the path.
inline std::string at_key(const std::string& where, std::string_view key) {
  return where + (where.ends_with(": ") ? "" : ".") + std::string(key);
}
inline std::string at_index(const std::string& where, size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw Error(where + ": " + what);
}

inline const char* type_name(const json& j) {
  return j.type_name();
}

// The field, or nullptr when it is absent or null (HF treats both as unset).
inline const json* find_field(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline const json& require_field(const json& obj, std::string_view key, const std::string& where) {
  if (!obj.is_object()) fail(where, std::string("expected an object, found ") + type_name(obj));
  const json* f = find_field(obj, key);
  if (f == nullptr) fail(at_key(where, key), "missing");
  return *f;
}

inline std::string as_string(const json& j, const std::string& where) {
  if (!j.is_string()) fail(where, std::string("expected a string, found ") + type_name(j));
  return j.get<std::string>();
}

inline std::string string_field(const json& obj, std::string_view key, const std::string& where) {
  return as_string(require_field(obj, key, where), at_key(where, key));
}

inline std::optional<std::string> optional_string(const json& obj, std::string_view key,
                                                  const std::string& where) {
  const json* f = find_field(obj, key);
  if (f == nullptr) return std::nullopt;
  return as_string(*f, at_key(where, key));
}

inline bool bool_field(const json& obj, std::string_view key, bool def, const std::string& where) {
  const json* f = find_field(obj, key);
  if (f == nullptr) return def;
  if (!f->is_boolean())
    fail(at_key(where, key), std::string("expected true/false, found ") + type_name(*f));
  return f->get<bool>();
}

inline int64_t as_int(const json& j, const std::string& where) {
  if (!j.is_number_integer())
    fail(where, std::string("expected an integer, found ") + type_name(j));
  return j.get<int64_t>();
}

// A token id: a non-negative integer that fits int32.
inline int32_t as_id(const json& j, const std::string& where) {
  const int64_t v = as_int(j, where);
  if (v < 0 || v > INT32_MAX) fail(where, "token id " + std::to_string(v) + " is out of range");
  return static_cast<int32_t>(v);
}

inline size_t size_field(const json& obj, std::string_view key, size_t def,
                         const std::string& where) {
  const json* f = find_field(obj, key);
  if (f == nullptr) return def;
  const int64_t v = as_int(*f, at_key(where, key));
  if (v < 0) fail(at_key(where, key), "must not be negative");
  return static_cast<size_t>(v);
}

// The "type" of a component, e.g. "BPE", "Sequence".
inline std::string type_field(const json& obj, const std::string& where) {
  return string_field(obj, "type", where);
}

// HF writes string-or-regex patterns as {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string text;
  bool is_regex = false;
};
inline Pattern pattern_field(const json& obj, const std::string& where) {
  const std::string w = at_key(where, "pattern");
  const json& p = require_field(obj, "pattern", where);
  if (const json* s = find_field(p, "String")) return {as_string(*s, at_key(w, "String")), false};
  if (const json* r = find_field(p, "Regex")) return {as_string(*r, at_key(w, "Regex")), true};
  if (p.is_string()) return {p.get<std::string>(), false};
  fail(w, "expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace edgellm::tok
