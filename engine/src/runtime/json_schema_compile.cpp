// JSON Schema -> grammar nodes (json_grammar_nodes.h). Whatever cannot be
// enforced is refused with a JsonSchemaError naming the keyword: a request
// never falls back to free text.
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/json_grammar_nodes.h"

namespace edgellm {

namespace {

using Json = nlohmann::ordered_json;  // keeps the properties in declared order

GrammarNode node(GrammarKind kind) {
  GrammarNode n;
  n.kind = kind;
  return n;
}

[[noreturn]] void refuse(const std::string& construct, const std::string& why) {
  throw JsonSchemaError(construct, "response_format: the JSON schema uses '" + construct +
                                       "', which structured output cannot enforce" +
                                       (why.empty() ? "" : " (" + why + ")"));
}

// Keywords that describe and never constrain.
const std::set<std::string> kAnnotations = {
    "title",      "description", "default",   "examples", "$schema",     "$id",    "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict", "discriminator"};
const std::set<std::string> kObjectKeys = {"properties", "required", "additionalProperties",
                                           "propertyNames"};
const std::set<std::string> kArrayKeys = {"items", "minItems", "maxItems", "uniqueItems"};
const std::set<std::string> kStringKeys = {"minLength", "maxLength"};
const std::set<std::string> kIntegerKeys = {"minimum", "maximum", "exclusiveMinimum",
                                            "exclusiveMaximum"};
const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                      "integer", "boolean", "null"};

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root) {}

  JsonGrammar run() { return finish(compile(root_)); }
  JsonGrammar finish(int32_t root) {
    g_.root = root;
    check_any_of_cycles();
    return std::move(g_);
  }

  int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = add({});  // any_of, filled below (it refers to itself through objects and arrays)
    GrammarNode object = node(GrammarKind::object);
    object.additional = any_;
    GrammarNode array = node(GrammarKind::array);
    array.items = any_;
    std::vector<int32_t> alts = {add(std::move(object)),
                                 add(std::move(array)),
                                 add(node(GrammarKind::string)),
                                 add(node(GrammarKind::number)),
                                 literal("true"),
                                 literal("false"),
                                 literal("null")};
    g_.nodes[static_cast<size_t>(any_)].alternatives = std::move(alts);
    return any_;
  }

  int32_t free_object() {
    GrammarNode object = node(GrammarKind::object);
    object.additional = any_value();
    return add(std::move(object));
  }

 private:
  int32_t add(GrammarNode node) {
    g_.nodes.push_back(std::move(node));
    return static_cast<int32_t>(g_.nodes.size() - 1);
  }
  int32_t literal(std::string text) {
    GrammarNode n = node(GrammarKind::literal);
    n.text = std::move(text);
    return add(std::move(n));
  }

  static int32_t count(const Json& s, const char* key) {
    const Json& v = s.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1'000'000)
      refuse(key, "expected a non-negative integer");
    return static_cast<int32_t>(v.get<int64_t>());
  }

  int32_t compile(const Json& s) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      refuse("false", "a schema that accepts nothing");
    }
    if (!s.is_object()) refuse("schema", "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || kObjectKeys.count(key) || kArrayKeys.count(key) ||
          kStringKeys.count(key) || kIntegerKeys.count(key))
        continue;
      if (key == "type" || key == "enum" || key == "const" || key == "anyOf" || key == "$ref")
        continue;
      refuse(key, "");
    }
    // The keywords that constrain, besides the annotations.
    std::vector<std::string> constraints;
    for (const auto& [key, value] : s.items())
      if (!kAnnotations.count(key)) constraints.push_back(key);
    const auto only = [&](const std::string& keyword, std::set<std::string> allowed) {
      allowed.insert(keyword);
      for (const std::string& key : constraints)
        if (!allowed.count(key)) refuse(key, "alongside '" + keyword + "'");
    };

    if (s.contains("$ref")) {
      only("$ref", {});
      return ref(s.at("$ref"));
    }
    if (s.contains("anyOf")) {
      only("anyOf", {});
      const Json& alts = s.at("anyOf");
      if (!alts.is_array() || alts.empty()) refuse("anyOf", "expected a non-empty array");
      const int32_t id = add({});
      std::vector<int32_t> ids;
      for (const Json& alt : alts) ids.push_back(compile(alt));
      g_.nodes[static_cast<size_t>(id)].alternatives = std::move(ids);
      return id;
    }
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("enum") && s.contains("const")) refuse("const", "alongside 'enum'");
      const bool is_enum = s.contains("enum");
      only(is_enum ? "enum" : "const", {"type"});
      std::vector<Json> values;
      if (is_enum) {
        if (!s.at("enum").is_array()) refuse("enum", "expected an array");
        values.assign(s.at("enum").begin(), s.at("enum").end());
      } else {
        values.push_back(s.at("const"));
      }
      std::vector<int32_t> ids;
      for (const Json& v : values)
        if (!s.contains("type") || matches_type(v, s.at("type"))) ids.push_back(literal(v.dump()));
      if (ids.empty()) refuse(is_enum ? "enum" : "const", "no value of the given type");
      GrammarNode n;
      n.alternatives = std::move(ids);
      return add(std::move(n));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s.at("type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) refuse("type", "expected type names");
          types.push_back(x.get<std::string>());
        }
      } else {
        refuse("type", "expected a type name or a list of them");
      }
      for (const std::string& type : types)
        if (!kTypes.count(type)) refuse("type", "unknown type '" + type + "'");
    } else {
      // No type: the keywords imply one (a narrower language, so still sound);
      // none at all means any value.
      std::set<std::string> implied;
      for (const std::string& key : constraints) {
        if (kObjectKeys.count(key)) implied.insert("object");
        if (kArrayKeys.count(key)) implied.insert("array");
        if (kStringKeys.count(key)) implied.insert("string");
        if (kIntegerKeys.count(key)) implied.insert("integer");
      }
      if (implied.empty()) return any_value();
      if (implied.size() > 1) refuse("type", "keywords of several types without a 'type'");
      types.push_back(*implied.begin());
    }
    if (types.size() == 1) return typed(s, types[0]);
    GrammarNode n;
    for (const std::string& type : types) n.alternatives.push_back(typed(s, type));
    return add(std::move(n));
  }

  static bool matches_type(const Json& v, const Json& type) {
    if (type.is_array()) {
      for (const Json& t : type)
        if (matches_type(v, t)) return true;
      return false;
    }
    const std::string t = type.is_string() ? type.get<std::string>() : "";
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "integer")
      return v.is_number_integer() ||
             (v.is_number_float() &&
              v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
    if (t == "number") return v.is_number();
    refuse("type", "unknown type '" + t + "'");
  }

  int32_t typed(const Json& s, const std::string& type) {
    if (type == "null") return literal("null");
    if (type == "boolean") {
      GrammarNode n;
      n.alternatives = {literal("true"), literal("false")};
      return add(std::move(n));
    }
    if (type == "number") {
      for (const std::string& key : kIntegerKeys)
        if (s.contains(key)) refuse(key, "on a number: bounds are enforced on integers only");
      return add(node(GrammarKind::number));
    }
    if (type == "integer") return integer(s);
    if (type == "string") {
      GrammarNode n = node(GrammarKind::string);
      if (s.contains("minLength")) n.min_length = count(s, "minLength");
      if (s.contains("maxLength")) n.max_length = count(s, "maxLength");
      if (n.max_length >= 0 && n.min_length > n.max_length)
        refuse("minLength", "greater than maxLength");
      return add(std::move(n));
    }
    if (type == "array") {
      GrammarNode n = node(GrammarKind::array);
      if (s.contains("minItems")) n.min_items = count(s, "minItems");
      if (s.contains("maxItems")) n.max_items = count(s, "maxItems");
      if (n.max_items >= 0 && n.min_items > n.max_items)
        refuse("minItems", "greater than maxItems");
      if (s.contains("uniqueItems") && s.at("uniqueItems") != Json(false))
        refuse("uniqueItems", "");
      const int32_t id = add(std::move(n));
      int32_t items;
      if (!s.contains("items")) {
        items = any_value();
      } else if (s.at("items") == Json(false)) {
        if (g_.nodes[static_cast<size_t>(id)].min_items > 0) refuse("items", "false with minItems");
        g_.nodes[static_cast<size_t>(id)].max_items = 0;
        items = any_value();
      } else {
        if (s.at("items").is_array()) refuse("items", "the tuple form (an array of schemas)");
        items = compile(s.at("items"));
      }
      g_.nodes[static_cast<size_t>(id)].items = items;
      return id;
    }
    // object
    const int32_t id = add(node(GrammarKind::object));
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s.at("required").is_array()) refuse("required", "expected an array of names");
      for (const Json& r : s.at("required")) {
        if (!r.is_string()) refuse("required", "expected an array of names");
        required.insert(r.get<std::string>());
      }
    }
    std::vector<GrammarProperty> props;
    if (s.contains("properties")) {
      if (!s.at("properties").is_object()) refuse("properties", "expected an object");
      for (const auto& [name, sub] : s.at("properties").items()) {
        GrammarProperty p;
        p.key = literal(Json(name).dump().substr(1));  // "name" less its opening quote
        p.value = compile(sub);
        p.required = required.erase(name) > 0;
        props.push_back(p);
      }
    }
    // Declared properties are all an object gets: extra ones (additionalProperties
    // absent, true or a schema) are allowed by the schema but never emitted.
    if (!required.empty())
      refuse("required", "'" + *required.begin() + "' is not among the declared properties");
    int32_t additional = -1, keys = -1;
    if (props.empty()) {
      const Json ap =
          s.contains("additionalProperties") ? s.at("additionalProperties") : Json(true);
      if (ap != Json(false)) additional = compile(ap);
      if (s.contains("propertyNames")) keys = key_schema(s.at("propertyNames"));
    } else if (s.contains("propertyNames")) {
      refuse("propertyNames", "alongside 'properties' (declared names are the only keys)");
    }
    GrammarNode& n = g_.nodes[static_cast<size_t>(id)];
    n.properties = std::move(props);
    n.additional = additional;
    n.keys = keys;
    return id;
  }

  // The string node free keys must match (propertyNames); -1 for any key. A key
  // is always a string, so only a string's own bounds can constrain it here.
  int32_t key_schema(const Json& s) {
    if (s == Json(true)) return -1;
    if (!s.is_object()) refuse("propertyNames", "expected a string schema");
    for (const auto& [key, value] : s.items())
      if (!kAnnotations.count(key) && !kStringKeys.count(key) &&
          !(key == "type" && value == Json("string")))
        refuse("propertyNames",
               "only 'minLength' and 'maxLength' are enforced on keys, not '" + key + "'");
    Json string_schema = s;
    string_schema["type"] = "string";
    return compile(string_schema);
  }

  // An integer within its bounds (each clipped to the 15 digits an integer may have).
  int32_t integer(const Json& s) {
    GrammarNode n = node(GrammarKind::integer);
    const auto bound = [&](const char* key) {
      const Json& v = s.at(key);
      if (!v.is_number()) refuse(key, "expected a number");
      return std::clamp(v.get<double>(), -1e16, 1e16);
    };
    const auto clip = [](double v) {
      return static_cast<int64_t>(std::clamp(v, -double(kMaxInteger), double(kMaxInteger)));
    };
    if (s.contains("minimum")) n.minimum = std::max(n.minimum, clip(std::ceil(bound("minimum"))));
    if (s.contains("exclusiveMinimum"))
      n.minimum = std::max(n.minimum, clip(std::floor(bound("exclusiveMinimum")) + 1));
    if (s.contains("maximum")) n.maximum = std::min(n.maximum, clip(std::floor(bound("maximum"))));
    if (s.contains("exclusiveMaximum"))
      n.maximum = std::min(n.maximum, clip(std::ceil(bound("exclusiveMaximum")) - 1));
    if (n.minimum > n.maximum) refuse("minimum", "no integer lies within the bounds");
    return add(std::move(n));
  }

  int32_t ref(const Json& r) {
    if (!r.is_string()) refuse("$ref", "expected a string");
    const std::string target = r.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') refuse("$ref", "only local references (#/...)");
    const Json* node = nullptr;
    try {
      node = &root_.at(Json::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      refuse("$ref", "'" + target + "' does not resolve");
    }
    // Registered before its target compiles, so that recursion refers back to it.
    const int32_t id = add({});
    refs_[target] = id;
    const int32_t body = compile(*node);
    g_.nodes[static_cast<size_t>(id)].alternatives = {body};
    return id;
  }

  // A cycle through any_of nodes alone ({"$ref": "#"} at the root) never
  // consumes a byte: the matcher would expand it forever.
  void check_any_of_cycles() const {
    std::vector<int> mark(g_.nodes.size(), 0);  // 0 new, 1 on the path, 2 done
    const auto visit = [&](auto&& self, int32_t id) -> void {
      if (g_.nodes[static_cast<size_t>(id)].kind != GrammarKind::any_of || mark[id] == 2) return;
      if (mark[id] == 1) refuse("$ref", "a reference cycle that never reaches a value");
      mark[id] = 1;
      for (const int32_t alt : g_.nodes[static_cast<size_t>(id)].alternatives) self(self, alt);
      mark[id] = 2;
    };
    for (size_t i = 0; i < g_.nodes.size(); ++i) visit(visit, static_cast<int32_t>(i));
  }

  const Json& root_;
  JsonGrammar g_;
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
};

}  // namespace

std::shared_ptr<const JsonGrammar> compile_json_schema(std::string_view schema_json) {
  Json schema;
  try {
    schema = Json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    throw JsonSchemaError("json",
                          std::string("response_format: the schema is not JSON: ") + e.what());
  }
  Compiler compiler(schema);
  return std::make_shared<const JsonGrammar>(compiler.run());
}

std::shared_ptr<const JsonGrammar> any_json_object() {
  static const std::shared_ptr<const JsonGrammar> grammar = [] {
    const Json empty = Json::object();
    Compiler compiler(empty);
    return std::make_shared<const JsonGrammar>(compiler.finish(compiler.free_object()));
  }();
  return grammar;
}

}  // namespace edgellm
