// The compiled form of a JSON Schema (json_schema_compile.cpp builds it,
// json_matcher.cpp walks it): a graph of nodes, each a set of JSON texts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edgellm/json_grammar.h"

namespace edgellm {

enum class GrammarKind : uint8_t {
  any_of,   // one of `alternatives` ($ref is a one-alternative any_of)
  object,   // `properties` in order, or free keys with `additional` values
  array,    // `items`, min_items..max_items of them
  string,   // min_length..max_length code points
  number,   // a JSON number
  integer,  // a JSON number without fraction or exponent
  literal,  // exactly `text` (true, false, null, enum and const values, property keys)
};

// An integer has at most 15 digits (so does a number before its point).
constexpr int kMaxDigits = 15;
constexpr int64_t kMaxInteger = 999'999'999'999'999;

struct GrammarProperty {
  int32_t key = -1;    // a literal node: the JSON-escaped name and its closing quote
  int32_t value = -1;  // the value's node
  bool required = false;
};

struct GrammarNode {
  GrammarKind kind = GrammarKind::any_of;
  std::vector<int32_t> alternatives;        // any_of
  std::vector<GrammarProperty> properties;  // object, declared order
  int32_t additional = -1;                  // object without properties: any key, this value
  int32_t keys = -1;                        // free keys: their string node (-1: any key)
  int32_t items = -1;                       // array
  int32_t min_items = 0, max_items = -1;    // array; -1 = unbounded
  int32_t min_length = 0, max_length = -1;  // string; -1 = unbounded
  int64_t minimum = -kMaxInteger, maximum = kMaxInteger;  // integer, both inclusive
  std::string text;                                       // literal

  // An object whose keys are free (no declared properties, values `additional`).
  bool free_keys() const { return properties.empty() && additional >= 0; }
};

class JsonGrammar {
 public:
  std::vector<GrammarNode> nodes;
  int32_t root = -1;
};

}  // namespace edgellm
