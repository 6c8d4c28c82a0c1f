// Structured output: a JSON Schema compiled into a grammar that constrains
// decoding (GenerateOptions::grammar). Every token sampled under it keeps the
// output a prefix of a document the schema accepts, so a finished generation
// parses and validates.
//
// What compiles (anything else is refused, naming the keyword: fail closed):
// type (one or a list), properties / required / additionalProperties,
// propertyNames (a free key's minLength / maxLength), items /
// minItems / maxItems, enum, const, anyOf, $ref to a local JSON pointer
// (#/$defs/..., #/definitions/..., #; recursion included), minLength / maxLength, an integer's
// minimum / maximum / exclusiveMinimum / exclusiveMaximum, and the
// annotations (title, description, default, examples, $schema, $id, $comment).
// Objects are emitted with their declared properties in declared order,
// optional ones skippable; output is compact JSON with at most one space after
// ':' and ','; numbers have at most 15 digits before and after the point and
// 2 in the exponent (every one fits a double).
//
// $ref resolves as JSON Schema defines: against the nearest enclosing schema
// with an "$id" (a resource root), else the whole document. A forced tool
// call's wrapper gives each tool's parameters an $id, so "#" there is the
// parameters (tool_calls.cpp).
//
// A bound the output cannot meet is refused naming it, never clipped into a
// wrong answer: an integer's minimum above 999999999999999 (or maximum below
// its negative) excludes every integer the grammar emits. A bound that only
// allows more than the grammar emits (maximum 1e300) is met by every output.
//
// A schema is untrusted input: compiling it stays within JsonSchemaLimits, in
// time and memory, and is refused (JsonSchemaError naming the limit) beyond.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

// What compiling one schema may cost. Each is far above what real schemas need
// (a large OpenAPI-style tool set compiles to a few thousand nodes, with
// references a few levels deep); each bounds a way a small hostile schema
// would otherwise crash the process or take seconds and gigabytes.
struct JsonSchemaLimits {
  // JSON nesting of the schema text: the request body's own bound.
  static constexpr int kMaxNesting = kMaxJsonDepth;
  // $ref hops from the document root to a definition, the shortest way: a flat
  // chain d0 -> d1 -> ... -> d12000 is refused at the first hop past this.
  static constexpr int kMaxRefDepth = 1000;
  // Grammar nodes: one per value schema, enum / const value, property key and $ref.
  static constexpr size_t kMaxNodes = 250'000;
  // Alternatives (anyOf, enum, type lists, $ref) with every reference followed:
  // the most any value may branch into, and the work of resolving them.
  static constexpr size_t kMaxAlternatives = 1'000'000;
  // Bytes of literal text (enum and const values, property names).
  static constexpr size_t kMaxLiteralBytes = 8u << 20;
  // minLength / maxLength / minItems / maxItems.
  static constexpr int64_t kMaxCount = 1'000'000;
};

// A compiled schema: immutable, shareable across threads and requests.
class JsonGrammar;

// A schema construct the engine cannot enforce, malformed schema JSON, or a
// schema beyond JsonSchemaLimits; construct() names the keyword or the limit
// ("pattern", "minimum", "oneOf", "$ref", "json", "size").
class JsonSchemaError : public Error {
 public:
  JsonSchemaError(std::string construct, const std::string& message)
      : Error(message), construct_(std::move(construct)) {}
  const std::string& construct() const { return construct_; }

 private:
  std::string construct_;
};

// Throws JsonSchemaError for a schema it cannot enforce and for malformed JSON.
std::shared_ptr<const JsonGrammar> compile_json_schema(std::string_view schema_json);
// Any JSON object (OpenAI's response_format {"type": "json_object"}).
std::shared_ptr<const JsonGrammar> any_json_object();

// OpenAI's `response_format` (the JSON text of its value), as every front end
// reads it: {"type": "text"} -> null (no constraint); {"type": "json_object"}
// -> any_json_object(); {"type": "json_schema", "json_schema": {"name",
// "schema", "strict", "description"}} -> compile_json_schema(schema), enforced
// whether strict or not. Throws JsonSchemaError, construct "response_format"
// when the value itself is malformed.
std::shared_ptr<const JsonGrammar> response_format_grammar(std::string_view response_format);

// The token masks need an index of `tokenizer`'s vocabulary (its byte strings
// in a trie), built once per tokenizer and shared: ~50 ms for SmolLM2's 49k
// tokens, ~0.2 s for Gemma 3's 262k. A constrained generation builds it when
// it is missing; a server builds it at start-up (Scheduler's constructor)
// instead, so that no request's first token, nor the streams decoding beside
// it, wait for it. Thread-safe; does nothing when the index exists.
void warm_grammar_index(const Tokenizer& tokenizer);
// How many vocabulary indexes this process has built (tests: a warmed index
// is not rebuilt by the first constrained request).
size_t grammar_index_builds();

}  // namespace edgellm
