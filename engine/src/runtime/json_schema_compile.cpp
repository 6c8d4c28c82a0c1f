// JSON Schema -> grammar nodes (json_grammar_nodes.h). Whatever cannot be
// enforced is refused with a JsonSchemaError naming the keyword: a request
// never falls back to free text.
//
// The schema is untrusted, so its cost is bounded (JsonSchemaLimits): native
// recursion follows only the JSON nesting of one schema (bounded when it is
// parsed); a $ref's target is compiled later, from a queue, so a chain of
// references costs no stack; nodes, literal bytes and alternatives are counted
// before they are added.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "edgellm/json_file.h"
#include "runtime/json_grammar_nodes.h"

namespace edgellm {

namespace {

using Json = nlohmann::ordered_json;  // keeps the properties in declared order
using Limits = JsonSchemaLimits;

GrammarNode node(GrammarKind kind) {
  GrammarNode n;
  n.kind = kind;
  return n;
}

[[noreturn]] void refuse(const std::string& construct, const std::string& why) {
  throw JsonSchemaError(construct, "the JSON schema uses '" + construct +
                                       "', which structured output cannot enforce" +
                                       (why.empty() ? "" : " (" + why + ")"));
}

// A JsonSchemaLimits budget spent: `what` names the input and the limit.
[[noreturn]] void over_limit(const std::string& construct, const std::string& what) {
  throw JsonSchemaError(construct, "the JSON schema is refused: " + what);
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

// A schema with its own "$id" (a URI, not a "#name" anchor) is a resource
// root: the "#..." references inside it resolve against it.
bool is_resource_root(const Json& s) {
  if (!s.is_object()) return false;
  const auto id = s.find("$id");
  return id != s.end() && id->is_string() && !id->get<std::string>().starts_with('#');
}

// A value the type "integer" admits: an integral number (1e300 included),
// tested without casting it to an integer type it may not fit.
bool is_integral(const Json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::trunc(d) == d;
}

std::string number_text(double v) {
  return Json(v).dump();
}

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root), resource_(&root) {}

  JsonGrammar run() {
    const int32_t root = compile(root_);
    // References, breadth first: each target's depth is its fewest hops from the root.
    while (!pending_.empty()) {
      const PendingRef p = pending_.front();
      pending_.pop_front();
      resource_ = p.resource;
      ref_depth_ = p.depth;
      const int32_t body = compile(*p.target);
      g_.nodes[static_cast<size_t>(p.id)].alternatives = {body};
    }
    return finish(root);
  }
  JsonGrammar finish(int32_t root) {
    g_.root = root;
    flatten_alternatives();
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
  // A reference whose target compiles later (run()).
  struct PendingRef {
    int32_t id;            // its one-alternative any_of, filled with the target's node
    const Json* target;    // the schema it points to
    const Json* resource;  // the resource root the target sits in
    int depth;             // $ref hops from the root
  };

  int32_t add(GrammarNode node) {
    if (g_.nodes.size() >= Limits::kMaxNodes)
      over_limit("size", "it compiles to more than " + std::to_string(Limits::kMaxNodes) +
                             " grammar nodes (the limit; one per value schema, enum or const "
                             "value, property and $ref)");
    g_.nodes.push_back(std::move(node));
    return static_cast<int32_t>(g_.nodes.size() - 1);
  }
  int32_t literal(std::string text) {
    literal_bytes_ += text.size();
    if (literal_bytes_ > Limits::kMaxLiteralBytes)
      over_limit("size", "its enum and const values and property names take more than " +
                             std::to_string(Limits::kMaxLiteralBytes) + " bytes (the limit)");
    GrammarNode n = node(GrammarKind::literal);
    n.text = std::move(text);
    return add(std::move(n));
  }

  static int32_t count(const Json& s, const char* key) {
    const Json& v = s.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      refuse(key, "expected a non-negative integer");
    if (v.get<int64_t>() > Limits::kMaxCount)
      refuse(key, v.dump() + " is above " + std::to_string(Limits::kMaxCount) +
                      ", the most structured output enforces");
    return static_cast<int32_t>(v.get<int64_t>());
  }

  int32_t compile(const Json& s) {
    // An embedded resource: its "#..." references resolve against it.
    const Json* const outer = resource_;
    if (&s != resource_ && is_resource_root(s)) resource_ = &s;
    const int32_t id = compile_here(s);
    resource_ = outer;
    return id;
  }

  int32_t compile_here(const Json& s) {
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
      if (is_enum && !s.at("enum").is_array()) refuse("enum", "expected an array");
      const Json single = is_enum ? Json() : Json::array({s.at("const")});
      const Json& values = is_enum ? s.at("enum") : single;
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
    if (t == "integer") return is_integral(v);
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
    if (type == "string") return add(string_node(s));
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

  // A string within s's minLength / maxLength.
  static GrammarNode string_node(const Json& s) {
    GrammarNode n = node(GrammarKind::string);
    if (s.contains("minLength")) n.min_length = count(s, "minLength");
    if (s.contains("maxLength")) n.max_length = count(s, "maxLength");
    if (n.max_length >= 0 && n.min_length > n.max_length)
      refuse("minLength", "greater than maxLength");
    return n;
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
    return add(string_node(s));
  }

  // An integer within its bounds. The grammar emits integers of at most 15
  // digits (|v| <= kMaxInteger): a lower bound above that (or an upper one
  // below its negative) admits none of them and is refused; one beyond it on
  // the other side admits them all.
  int32_t integer(const Json& s) {
    GrammarNode n = node(GrammarKind::integer);
    constexpr double kLargest = static_cast<double>(kMaxInteger);
    const auto bound = [&](const char* key) {
      const Json& v = s.at(key);
      if (!v.is_number()) refuse(key, "expected a number");
      return v.get<double>();
    };
    // The least (or greatest) integer the bound admits, within the emitted range.
    const auto lower = [&](const char* key, double least) {
      if (least > kLargest)
        refuse(key, number_text(bound(key)) + " is above " + std::to_string(kMaxInteger) +
                        ", the largest integer structured output emits (15 digits)");
      n.minimum = std::max(n.minimum, static_cast<int64_t>(std::max(least, -kLargest)));
    };
    const auto upper = [&](const char* key, double greatest) {
      if (greatest < -kLargest)
        refuse(key, number_text(bound(key)) + " is below -" + std::to_string(kMaxInteger) +
                        ", the smallest integer structured output emits (15 digits)");
      n.maximum = std::min(n.maximum, static_cast<int64_t>(std::min(greatest, kLargest)));
    };
    if (s.contains("minimum")) lower("minimum", std::ceil(bound("minimum")));
    if (s.contains("exclusiveMinimum"))
      lower("exclusiveMinimum", std::floor(bound("exclusiveMinimum")) + 1);
    if (s.contains("maximum")) upper("maximum", std::floor(bound("maximum")));
    if (s.contains("exclusiveMaximum"))
      upper("exclusiveMaximum", std::ceil(bound("exclusiveMaximum")) - 1);
    if (n.minimum > n.maximum) refuse("minimum", "no integer lies within the bounds");
    return add(std::move(n));
  }

  int32_t ref(const Json& r) {
    if (!r.is_string()) refuse("$ref", "expected a string");
    const std::string target = r.get<std::string>();
    const auto key = std::make_pair(resource_, target);
    if (const auto it = refs_.find(key); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') refuse("$ref", "only local references (#/...)");
    const Json* resource = resource_;
    const Json* node = resolve(target, resource);
    if (ref_depth_ + 1 > Limits::kMaxRefDepth)
      over_limit("$ref", "'" + target + "' is more than " + std::to_string(Limits::kMaxRefDepth) +
                             " $ref hops from the root (the limit on reference depth)");
    // Registered before its target compiles, so that recursion refers back to it.
    const int32_t id = add({});
    refs_[key] = id;
    pending_.push_back({id, node, resource, ref_depth_ + 1});
    return id;
  }

  // The schema a "#/a/b" JSON pointer names inside resource_; `resource`
  // becomes the resource root the target sits in (the innermost one it passes).
  const Json* resolve(const std::string& target, const Json*& resource) {
    const Json* node = resource_;
    std::string_view rest = std::string_view(target).substr(1);
    const auto fail = [&]() -> const Json* { refuse("$ref", "'" + target + "' does not resolve"); };
    if (!rest.empty() && rest[0] != '/') return fail();
    while (!rest.empty()) {
      rest.remove_prefix(1);  // the '/'
      const size_t end = std::min(rest.find('/'), rest.size());
      std::string token;
      for (size_t i = 0; i < end; ++i) {  // ~1 is '/', ~0 is '~'
        if (rest[i] != '~') {
          token += rest[i];
        } else if (i + 1 < end && (rest[i + 1] == '0' || rest[i + 1] == '1')) {
          token += rest[++i] == '0' ? '~' : '/';
        } else {
          return fail();
        }
      }
      rest.remove_prefix(end);
      if (node->is_object()) {
        node = member(*node, token);
        if (!node) return fail();
      } else if (node->is_array()) {
        const bool index =
            !token.empty() && token.size() < 10 &&
            std::all_of(token.begin(), token.end(),
                        [](char c) { return std::isdigit(static_cast<uint8_t>(c)); }) &&
            (token == "0" || token[0] != '0');
        if (!index || std::stoul(token) >= node->size()) return fail();
        node = &(*node)[std::stoul(token)];
      } else {
        return fail();
      }
      if (!rest.empty() && is_resource_root(*node)) resource = node;
    }
    return node;
  }

  // object[key], or null. ordered_json finds a key by a linear search: a large
  // object ($defs with thousands of entries) gets a hash index, built once.
  const Json* member(const Json& object, const std::string& key) {
    if (object.size() <= 16) {
      const auto it = object.find(key);
      return it == object.end() ? nullptr : &*it;
    }
    auto [index, added] = key_index_.try_emplace(&object);
    if (added)
      for (const auto& entry : object.items()) index->second.emplace(entry.key(), &entry.value());
    const auto it = index->second.find(key);
    return it == index->second.end() ? nullptr : it->second;
  }

  // Makes every any_of's alternatives the values it may begin (no any_of
  // among them, each once), so the matcher expands one level per byte however
  // references and anyOf nest or share. Iterative (a chain of references may
  // be long), counting the alternatives it visits against the budget; a cycle
  // through any_of nodes alone ({"$ref": "#"} at the root) never consumes a
  // byte and is refused.
  void flatten_alternatives() {
    std::vector<GrammarNode>& nodes = g_.nodes;
    const auto is_any_of = [&](int32_t id) {
      return nodes[static_cast<size_t>(id)].kind == GrammarKind::any_of;
    };
    enum : uint8_t { kNew, kOnPath, kDone };
    std::vector<uint8_t> mark(nodes.size(), kNew);
    std::vector<int32_t> seen(nodes.size(), -1);  // the node whose list holds it already
    size_t visited = 0;
    std::vector<std::pair<int32_t, size_t>> path;  // (any_of node, next alternative)
    for (size_t start = 0; start < nodes.size(); ++start) {
      if (!is_any_of(static_cast<int32_t>(start)) || mark[start] == kDone) continue;
      path.push_back({static_cast<int32_t>(start), 0});
      mark[start] = kOnPath;
      while (!path.empty()) {
        const int32_t id = path.back().first;
        size_t& next = path.back().second;
        const std::vector<int32_t>& alts = nodes[static_cast<size_t>(id)].alternatives;
        if (next < alts.size()) {
          const int32_t alt = alts[next++];
          if (!is_any_of(alt) || mark[static_cast<size_t>(alt)] == kDone) continue;
          if (mark[static_cast<size_t>(alt)] == kOnPath)
            refuse("$ref", "a reference cycle that never reaches a value");
          mark[static_cast<size_t>(alt)] = kOnPath;
          path.push_back({alt, 0});
          continue;
        }
        // Every alternative is flat now: splice theirs in.
        std::vector<int32_t> flat;
        const auto take = [&](int32_t alt) {
          if (++visited > Limits::kMaxAlternatives)
            over_limit("anyOf",
                       "its alternatives (anyOf, enum, type lists and $ref), with "
                       "every reference followed, number more than " +
                           std::to_string(Limits::kMaxAlternatives) + " (the limit)");
          if (seen[static_cast<size_t>(alt)] == id) return;
          seen[static_cast<size_t>(alt)] = id;
          flat.push_back(alt);
        };
        for (const int32_t alt : alts) {
          if (!is_any_of(alt)) {
            take(alt);
            continue;
          }
          for (const int32_t leaf : nodes[static_cast<size_t>(alt)].alternatives) take(leaf);
        }
        nodes[static_cast<size_t>(id)].alternatives = std::move(flat);
        mark[static_cast<size_t>(id)] = kDone;
        path.pop_back();
      }
    }
  }

  const Json& root_;
  const Json* resource_;  // the resource root "#..." references resolve against
  int ref_depth_ = 0;     // $ref hops from the root to the schema being compiled
  size_t literal_bytes_ = 0;
  JsonGrammar g_;
  std::map<std::pair<const Json*, std::string>, int32_t> refs_;
  std::deque<PendingRef> pending_;
  std::unordered_map<const Json*, std::unordered_map<std::string_view, const Json*>> key_index_;
  int32_t any_ = -1;
};

}  // namespace

std::shared_ptr<const JsonGrammar> compile_json_schema(std::string_view schema_json) {
  Json schema;
  try {  // bounded nesting: the compiler recurses once per level
    schema = parse_ordered_json(schema_json, "the JSON schema");
  } catch (const Error& e) {
    throw JsonSchemaError("json", e.what());
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
