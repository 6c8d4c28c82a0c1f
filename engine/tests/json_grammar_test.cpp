// Structured output: schemas compile or are refused naming the construct; the
// matcher accepts exactly the documents the grammar allows (each construct,
// escapes, UTF-8, nesting, min/max items, anyOf ambiguity, $ref recursion);
// hostile schemas stay within JsonSchemaLimits;
// the token mask agrees with the matcher token by token; a constrained
// Generation on random logits always yields a valid document.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "edgellm/generate.h"
#include "edgellm/json_grammar.h"
#include "runtime/json_matcher.h"
#include "runtime/token_mask.h"
#include "sanitized.h"
#include "test_util.h"

namespace edgellm {
namespace {

// The whole document is accepted and complete.
bool accepts(const std::shared_ptr<const JsonGrammar>& g, std::string_view text) {
  JsonMatcher m(g);
  return m.accept(text) && m.complete();
}
bool accepts(std::string_view schema, std::string_view text) {
  return accepts(compile_json_schema(schema), text);
}
// A prefix of an accepted document.
bool prefix(std::string_view schema, std::string_view text) {
  JsonMatcher m(compile_json_schema(schema));
  return m.accept(text);
}
std::string refused(std::string_view schema) {
  try {
    compile_json_schema(schema);
  } catch (const JsonSchemaError& e) {
    return e.construct();
  }
  return "";
}

TEST(JsonGrammar, RefusesWhatItCannotEnforceNamingTheConstruct) {
  EXPECT_EQ(refused(R"({"type": "string", "pattern": "^a+$"})"), "pattern");
  EXPECT_EQ(refused(R"({"type": "string", "format": "date"})"), "format");
  EXPECT_EQ(refused(R"({"type": "number", "minimum": 0})"), "minimum");  // integers only
  EXPECT_EQ(refused(R"({"type": "integer", "minimum": 3, "maximum": 2})"), "minimum");
  EXPECT_EQ(refused(R"({"type": "integer", "exclusiveMinimum": true})"), "exclusiveMinimum");
  EXPECT_EQ(refused(R"({"type": "number", "multipleOf": 2})"), "multipleOf");
  EXPECT_EQ(refused(R"({"oneOf": [{"type": "string"}, {"type": "null"}]})"), "oneOf");
  EXPECT_EQ(refused(R"({"allOf": [{"type": "string"}]})"), "allOf");
  EXPECT_EQ(refused(R"({"not": {"type": "string"}})"), "not");
  EXPECT_EQ(refused(R"({"type": "object", "patternProperties": {"a": {}}})"), "patternProperties");
  EXPECT_EQ(
      refused(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})"),
      "pattern");
  EXPECT_EQ(refused(R"({"type": "object", "required": ["b"], "properties": {"a": {}}})"),
            "required");
  EXPECT_EQ(refused(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "minItems");
  EXPECT_EQ(refused(R"({"type": "array", "uniqueItems": true})"), "uniqueItems");
  EXPECT_EQ(refused(R"({"type": "array", "prefixItems": [{}]})"), "prefixItems");
  EXPECT_EQ(refused(R"({"type": "array", "items": [{}, {}]})"), "items");
  EXPECT_EQ(refused(R"({"type": "strange"})"), "type");
  EXPECT_EQ(refused(R"({"$ref": "#/$defs/missing"})"), "$ref");
  EXPECT_EQ(refused(R"({"$ref": "#"})"), "$ref");  // a cycle that never reaches a value
  EXPECT_EQ(refused(R"({"$ref": "#/$defs/a", "minLength": 1, "$defs": {"a": {}}})"), "minLength");
  EXPECT_EQ(refused(R"({"type": "object", "propertyNames": {"pattern": "^a"}})"), "propertyNames");
  EXPECT_EQ(refused(R"({"type": "object", "propertyNames": {"enum": ["a"]}})"), "propertyNames");
  EXPECT_EQ(refused(R"({"type": "object", "propertyNames": {"maxLength": 2},
                        "properties": {"a": {}}})"),
            "propertyNames");
  EXPECT_EQ(refused(R"({"frobnicate": 1})"), "frobnicate");  // unknown keywords fail closed
  EXPECT_EQ(refused(R"({"type": "object",)"), "json");
  EXPECT_EQ(refused("false"), "false");
  // Annotations do not constrain: they compile.
  EXPECT_EQ(refused(R"({"title": "T", "description": "d", "type": "string", "default": "x",
                        "examples": ["y"], "$schema": "https://json-schema.org/draft/2020-12/schema"})"),
            "");
  try {
    compile_json_schema(R"({"type": "string", "pattern": "x"})");
  } catch (const JsonSchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("'pattern'"), std::string::npos) << e.what();
  }
}

TEST(JsonGrammar, Scalars) {
  EXPECT_TRUE(accepts(R"({"type": "string"})", R"("hi")"));
  EXPECT_FALSE(accepts(R"({"type": "string"})", R"(hi)"));
  EXPECT_FALSE(accepts(R"({"type": "string"})", R"("hi)"));
  EXPECT_TRUE(accepts(R"({"type": "boolean"})", "true"));
  EXPECT_TRUE(accepts(R"({"type": "boolean"})", "false"));
  EXPECT_FALSE(accepts(R"({"type": "boolean"})", "null"));
  EXPECT_TRUE(accepts(R"({"type": "null"})", "null"));
  for (const char* n : {"0", "-0", "12", "-3.25", "1e5", "2.5E-3", "7e+10"})
    EXPECT_TRUE(accepts(R"({"type": "number"})", n)) << n;
  for (const char* n : {"01", "-", "1.", ".5", "1e", "+1", "1.5.2", "--1"})
    EXPECT_FALSE(accepts(R"({"type": "number"})", n)) << n;
  EXPECT_TRUE(accepts(R"({"type": "integer"})", "-42"));
  EXPECT_FALSE(accepts(R"({"type": "integer"})", "4.2"));
  EXPECT_FALSE(accepts(R"({"type": "integer"})", "4e2"));
  // Bounded digits: a model cannot spin on one number forever.
  EXPECT_TRUE(accepts(R"({"type": "integer"})", std::string(15, '9')));
  EXPECT_FALSE(accepts(R"({"type": "integer"})", std::string(16, '9')));
  EXPECT_TRUE(accepts(R"({"type": ["string", "null"]})", "null"));
  EXPECT_TRUE(accepts(R"({"type": ["string", "null"]})", R"("x")"));
  EXPECT_FALSE(accepts(R"({"type": ["string", "null"]})", "1"));
}

TEST(JsonGrammar, IntegerBounds) {
  const char* s = R"({"type": "integer", "minimum": 10, "maximum": 20})";
  for (const char* n : {"10", "15", "20"}) EXPECT_TRUE(accepts(s, n)) << n;
  for (const char* n : {"9", "21", "100", "-5", "0", "1"}) EXPECT_FALSE(accepts(s, n)) << n;
  EXPECT_TRUE(prefix(s, "1"));   // 10..19 remain
  EXPECT_FALSE(prefix(s, "3"));  // nothing in range begins with 3
  EXPECT_FALSE(prefix(s, "-"));
  const char* positive = R"({"type": "integer", "exclusiveMinimum": 0})";
  EXPECT_TRUE(accepts(positive, "1"));
  EXPECT_TRUE(accepts(positive, "999999999999999"));
  EXPECT_FALSE(accepts(positive, "0"));
  EXPECT_FALSE(prefix(positive, "-"));
  const char* negative = R"({"type": "integer", "minimum": -5, "maximum": -2})";
  EXPECT_TRUE(accepts(negative, "-5"));
  EXPECT_TRUE(accepts(negative, "-2"));
  for (const char* n : {"-1", "-6", "0", "2", "-50"}) EXPECT_FALSE(accepts(negative, n)) << n;
  EXPECT_FALSE(prefix(negative, "-1"));
  EXPECT_TRUE(accepts(R"({"type": "integer", "maximum": 5})", "-100"));
  EXPECT_FALSE(accepts(R"({"type": "integer", "maximum": 5})", "50"));
  EXPECT_TRUE(accepts(R"({"type": "integer", "minimum": 2.5})", "3"));
  EXPECT_FALSE(accepts(R"({"type": "integer", "minimum": 2.5})", "2"));
  EXPECT_TRUE(accepts(R"({"type": "integer", "exclusiveMaximum": 7.5})", "7"));
  EXPECT_FALSE(accepts(R"({"type": "integer", "exclusiveMaximum": 7})", "7"));
  // Bounds inside arrays and objects: the number ends at ',' / ']' / '}' only in range.
  const char* arr = R"({"type": "array", "items": {"type": "integer", "minimum": 1,
                        "maximum": 3}})";
  EXPECT_TRUE(accepts(arr, "[1, 2,3]"));
  EXPECT_FALSE(accepts(arr, "[1,0]"));
  EXPECT_FALSE(accepts(arr, "[4]"));
  // No type: the bounds imply an integer.
  EXPECT_TRUE(accepts(R"({"minimum": 0})", "7"));
  EXPECT_FALSE(accepts(R"({"minimum": 0})", "7.5"));
}

TEST(JsonGrammar, StringsEscapesAndUtf8) {
  const char* s = R"({"type": "string"})";
  EXPECT_TRUE(accepts(s, R"("a\"b\\c\/d\n\t\u00e9\u20AC")"));
  EXPECT_FALSE(accepts(s, R"("\x")"));
  EXPECT_FALSE(accepts(s, R"("\u00g0")"));
  EXPECT_FALSE(accepts(s, R"("\ud83d\ude00")"));  // surrogates: raw UTF-8 instead
  EXPECT_FALSE(accepts(s, "\"a\nb\""));           // control bytes must be escaped
  EXPECT_TRUE(accepts(s, "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(s, "\"\xC3\""));              // a truncated character
  EXPECT_FALSE(accepts(s, "\"\xC0\xAF\""));          // overlong
  EXPECT_FALSE(accepts(s, "\"\xED\xA0\x80\""));      // an encoded surrogate
  EXPECT_FALSE(accepts(s, "\"\xF4\x90\x80\x80\""));  // above U+10FFFF
  // Lengths count code points (an escape or a UTF-8 character is one).
  const char* len = R"({"type": "string", "minLength": 2, "maxLength": 3})";
  EXPECT_FALSE(accepts(len, R"("a")"));
  EXPECT_TRUE(accepts(len, R"("ab")"));
  EXPECT_TRUE(accepts(len, "\"\xC3\xA9\\n\\u0041\""));
  EXPECT_FALSE(accepts(len, R"("abcd")"));
  EXPECT_FALSE(prefix(len, R"("abcd)"));
}

TEST(JsonGrammar, ObjectsInDeclaredOrderWithOptionalOnesSkippable) {
  const char* schema = R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["name", "tags"]})";
  EXPECT_TRUE(accepts(schema, R"({"name":"a","age":3,"tags":[]})"));
  EXPECT_TRUE(accepts(schema, R"({"name": "a", "tags": ["x", "y"]})"));
  EXPECT_FALSE(accepts(schema, R"({"name":"a"})"));                    // tags is required
  EXPECT_FALSE(accepts(schema, R"({"age":3,"name":"a","tags":[]})"));  // order
  EXPECT_FALSE(accepts(schema, R"({"name":"a","tags":[],"x":1})"));    // undeclared
  EXPECT_FALSE(accepts(schema, R"({ "name":"a","tags":[]})"));         // no space after '{'
  EXPECT_FALSE(accepts(schema, R"({"name":  "a","tags":[]})"));        // one space at most
  EXPECT_TRUE(accepts(R"({"type": "object"})", R"({"any": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(accepts(R"({"type": "object", "additionalProperties": false})", "{}"));
  EXPECT_FALSE(accepts(R"({"type": "object", "additionalProperties": false})", R"({"a":1})"));
  EXPECT_TRUE(accepts(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
                      R"({"a":1,"b":2})"));
  EXPECT_FALSE(accepts(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
                       R"({"a":"x"})"));
  // propertyNames bounds a free key as minLength / maxLength bound a string value.
  const char* keys = R"({"type": "object", "propertyNames": {"minLength": 2, "maxLength": 3},
                         "additionalProperties": {"type": "integer"}})";
  EXPECT_TRUE(accepts(keys, R"({"ab":1,"xyz":2})"));
  EXPECT_TRUE(accepts(keys, R"({"\u00e9\n":1})"));  // escapes count as one code point each
  EXPECT_FALSE(prefix(keys, R"({"abcd)"));          // a key past maxLength is cut off at once
  EXPECT_FALSE(accepts(keys, R"({"a":1})"));        // shorter than minLength
  EXPECT_TRUE(accepts(R"({"type": "object", "propertyNames": true})", R"({"anything":1})"));
  EXPECT_TRUE(accepts(R"({"propertyNames": {"type": "string", "maxLength": 1}})", R"({"k":[]})"));
  // Keys are JSON-escaped as the schema spells them.
  EXPECT_TRUE(accepts(R"({"type": "object", "properties": {"a\"b": {"type": "null"}},
                          "required": ["a\"b"]})",
                      R"({"a\"b":null})"));
}

TEST(JsonGrammar, ArraysMinMaxItems) {
  const char* schema = R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
                           "maxItems": 3})";
  EXPECT_FALSE(accepts(schema, "[]"));
  EXPECT_TRUE(accepts(schema, "[1]"));
  EXPECT_TRUE(accepts(schema, "[1, 2,3]"));
  EXPECT_FALSE(prefix(schema, "[1,2,3,"));
  EXPECT_TRUE(accepts(R"({"type": "array"})", "[]"));
  EXPECT_TRUE(accepts(R"({"type": "array"})", R"([1,"a",[true],{}])"));
  EXPECT_FALSE(accepts(R"({"type": "array", "items": false})", "[1]"));
  EXPECT_TRUE(accepts(R"({"type": "array", "items": false})", "[]"));
}

TEST(JsonGrammar, EnumConstAnyOf) {
  const char* e = R"({"enum": ["red", "green", 3, null, {"a": [1]}]})";
  EXPECT_TRUE(accepts(e, R"("red")"));
  EXPECT_TRUE(accepts(e, "3"));
  EXPECT_TRUE(accepts(e, "null"));
  EXPECT_TRUE(accepts(e, R"({"a":[1]})"));
  EXPECT_FALSE(accepts(e, R"("blue")"));
  EXPECT_FALSE(accepts(e, R"("re")"));
  EXPECT_TRUE(accepts(R"({"const": "x"})", R"("x")"));
  EXPECT_TRUE(accepts(R"({"type": "string", "enum": ["a", 1]})", R"("a")"));
  EXPECT_FALSE(accepts(R"({"type": "string", "enum": ["a", 1]})", "1"));
  // Alternatives that share a prefix stay open until the bytes tell them apart.
  const char* any = R"({"anyOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
       "required": ["kind", "r"]},
      {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
       "required": ["kind", "side"]}]})";
  EXPECT_TRUE(accepts(any, R"({"kind":"circle","r":1.5})"));
  EXPECT_TRUE(accepts(any, R"({"kind":"square","side":2})"));
  EXPECT_FALSE(accepts(any, R"({"kind":"circle","side":2})"));
  EXPECT_TRUE(accepts(R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})", "1.5"));
}

TEST(JsonGrammar, RefsAndRecursion) {
  const char* tree = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"value": {"type": "integer"}, "children": {"type": "array",
      "items": {"$ref": "#/$defs/node"}}}, "required": ["value"]}}})";
  EXPECT_TRUE(accepts(tree, R"({"value":1})"));
  EXPECT_TRUE(accepts(tree, R"({"value":1,"children":[{"value":2,"children":[{"value":3}]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"value":1,"children":[{"children":[]}]})"));
  const char* defs = R"({"type": "object", "properties": {"p": {"$ref": "#/definitions/P"}},
      "required": ["p"], "definitions": {"P": {"type": "string", "description": "d"}}})";
  EXPECT_TRUE(accepts(defs, R"({"p":"x"})"));
}

TEST(JsonGrammar, AnyJsonObject) {
  const auto g = any_json_object();
  EXPECT_TRUE(accepts(g, "{}"));
  EXPECT_TRUE(accepts(g, R"({"a": [1, 2.5, "x", true, null, {"b": {}}]})"));
  EXPECT_FALSE(accepts(g, "[]"));
  EXPECT_FALSE(accepts(g, R"("x")"));
  EXPECT_FALSE(accepts(g, R"({"a":1} )"));  // nothing after the document
  JsonMatcher m(g);
  ASSERT_TRUE(m.accept("{}"));
  EXPECT_TRUE(m.ended());
  EXPECT_EQ(m.string_room(), -1);  // no frame left to look at (the fuzzer found this)
  JsonMatcher n(compile_json_schema(R"({"type": "integer"})"));
  ASSERT_TRUE(n.accept("12"));
  EXPECT_TRUE(n.complete());
  EXPECT_FALSE(n.ended());  // more digits may follow
}

// A byte-level vocabulary with JSON pieces: every token's bytes as its text.
Tokenizer json_tokenizer(std::vector<std::string>& pieces) {
  pieces = {"{",  "}", "[",   "]",    ",",     ":",    "\"",  " ",   "a",     "b",    "1",
            "23", "-", ".",   "true", "false", "null", "{\"", "\":", "\",\"", "name", "age",
            "\\", "n", "u00", "e9",   "\"}",   "},",   "x\"", ",\"", "é",     "0"};
  // Every printable ASCII byte is a token too (as in byte-level BPE): no dead ends.
  for (char c = 0x20; c < 0x7F; ++c)
    if (std::find(pieces.begin(), pieces.end(), std::string(1, c)) == pieces.end())
      pieces.emplace_back(1, c);
  const nlohmann::json tok = testing::piece_tokenizer_json(pieces, {{"</s>", true}});
  const auto dir = testing::make_temp_dir("json_grammar");
  testing::write_text(dir / "tokenizer.json", tok.dump());
  return Tokenizer::load(dir);
}

TEST(JsonGrammar, MaskAgreesWithTheMatcher) {
  std::vector<std::string> pieces;
  const Tokenizer tokenizer = json_tokenizer(pieces);
  const auto index = TokenIndex::of(tokenizer);
  EXPECT_EQ(TokenIndex::of(tokenizer), index);  // cached
  const auto g = compile_json_schema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"},
      "zip": {"type": "string", "maxLength": 2}}, "required": ["name"]})");
  for (const char* prefix_text :
       {"", "{", "{\"", "{\"name\":", "{\"name\":\"ab", "{\"name\":\"a\\",
        "{\"name\":\"a\",\"age\":1", "{\"name\":\"a\",\"zip\":\"", "{\"name\":\"a\",\"zip\":\"x"}) {
    JsonMatcher m(g);
    ASSERT_TRUE(m.accept(prefix_text)) << prefix_text;
    TokenMasker masker(index, m);
    std::vector<uint64_t> bits;
    masker.compute(bits);
    for (size_t id = 0; id < pieces.size(); ++id) {
      JsonMatcher copy = m;
      const bool expect = copy.accept(index->bytes(static_cast<int32_t>(id)));
      EXPECT_EQ(static_cast<bool>(bits[id / 64] >> (id % 64) & 1), expect)
          << "after '" << prefix_text << "' token '" << pieces[id] << "'";
    }
  }
}

TEST(JsonGrammar, ConstrainedGenerationOnRandomLogitsIsAlwaysValid) {
  std::vector<std::string> pieces;
  const Tokenizer tokenizer = json_tokenizer(pieces);
  ModelConfig config;
  config.vocab_size = static_cast<int>(pieces.size() + 1);
  const int eos = static_cast<int>(pieces.size());
  config.eos_token_ids = {eos};
  const auto g = compile_json_schema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
      "required": ["name", "age"]})");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int finished = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    GenerateOptions o;
    o.max_tokens = 200;
    o.grammar = g;
    o.sampling.temperature = seed % 4 == 0 ? 0.0f : 1.0f;
    o.sampling.seed = seed;
    o.sampling.top_k = seed % 3 == 0 ? 5 : 0;
    Generation gen(tokenizer, config, o);
    while (!gen.done()) {
      std::vector<float> logits(static_cast<size_t>(config.vocab_size));
      for (float& x : logits) x = normal(rng);
      logits[static_cast<size_t>(eos)] += 3.0f;  // a model keen to stop early
      gen.next(logits);
    }
    if (gen.finish_reason() != FinishReason::stop) continue;
    ++finished;
    const auto doc = nlohmann::json::parse(gen.text());
    EXPECT_TRUE(accepts(g, gen.text())) << gen.text();
    EXPECT_TRUE(doc.contains("name") && doc.contains("age")) << gen.text();
  }
  EXPECT_GT(finished, 100);
}

}  // namespace
}  // namespace edgellm

namespace edgellm {
namespace {

// Random logits through the mask, many schemas: every finished output is JSON
// the matcher accepts whole (the Python tests validate against jsonschema).
TEST(JsonGrammar, RandomConstrainedDocumentsAreComplete) {
  std::vector<std::string> pieces;
  const Tokenizer tokenizer = json_tokenizer(pieces);
  ModelConfig config;
  config.vocab_size = static_cast<int>(pieces.size() + 1);
  const int eos = static_cast<int>(pieces.size());
  config.eos_token_ids = {eos};
  const char* schemas[] = {
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})",
      R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "number"}, {"type": "null"}]})",
      R"({"enum": ["a", "ab", "abc", 1, true]})",
      R"({"$ref": "#/$defs/t", "$defs": {"t": {"type": "object", "properties": {
          "n": {"type": "integer"}, "c": {"type": "array", "items": {"$ref": "#/$defs/t"},
          "maxItems": 2}}, "required": ["n"]}}})",
      R"({"type": "object", "additionalProperties": {"type": "boolean"}})",
      R"({"type": "string", "minLength": 2, "maxLength": 4})",
      R"({"type": "array", "items": {"type": "integer", "minimum": -37, "maximum": 1234},
          "maxItems": 4})",
      R"({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"},
          "c": {"type": "null"}}})",
  };
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const char* schema : schemas) {
    const auto g = compile_json_schema(schema);
    int finished = 0;
    for (uint64_t seed = 0; seed < 60; ++seed) {
      GenerateOptions o;
      o.max_tokens = 120;
      o.grammar = g;
      o.sampling.temperature = 1.0f;
      o.sampling.seed = seed;
      Generation gen(tokenizer, config, o);
      while (!gen.done()) {
        std::vector<float> logits(static_cast<size_t>(config.vocab_size));
        for (float& x : logits) x = normal(rng);
        logits[static_cast<size_t>(eos)] += 4.0f;
        gen.next(logits);
      }
      if (gen.finish_reason() != FinishReason::stop) continue;
      ++finished;
      EXPECT_TRUE(accepts(g, gen.text())) << schema << "\n" << gen.text();
      EXPECT_TRUE(nlohmann::json::accept(gen.text())) << schema << "\n" << gen.text();
      const auto doc = nlohmann::json::parse(gen.text(), nullptr, false);
      if (std::string_view(schema).find("1234") != std::string_view::npos)  // the bounded ones
        for (const auto& x : doc)
          if (x.is_number_integer()) {
            EXPECT_GE(x.get<int64_t>(), -37) << gen.text();
            EXPECT_LE(x.get<int64_t>(), 1234) << gen.text();
          }
    }
    EXPECT_GT(finished, 20) << schema;
  }
}

TEST(JsonGrammar, AWarmedIndexIsNotRebuilt) {
  std::vector<std::string> pieces;
  const Tokenizer tokenizer = json_tokenizer(pieces);
  const size_t before = grammar_index_builds();
  warm_grammar_index(tokenizer);
  EXPECT_EQ(grammar_index_builds(), before + 1);
  warm_grammar_index(tokenizer);  // already there
  ModelConfig config;
  config.vocab_size = static_cast<int>(pieces.size() + 1);
  config.eos_token_ids = {static_cast<int>(pieces.size())};
  GenerateOptions o;
  o.grammar = compile_json_schema(R"({"type": "boolean"})");
  Generation gen(tokenizer, config, o);  // the first constrained generation
  gen.next(std::vector<float>(pieces.size() + 1, 0.0f));
  EXPECT_EQ(grammar_index_builds(), before + 1);
}

// Under a grammar the logprobs are the masked distribution's: the chosen token
// and every alternative are ones it allows, and their probabilities sum to 1
// over the allowed tokens.
TEST(JsonGrammar, LogprobsComeFromTheMaskedDistribution) {
  std::vector<std::string> pieces;
  const Tokenizer tokenizer = json_tokenizer(pieces);
  ModelConfig config;
  config.vocab_size = static_cast<int>(pieces.size() + 1);
  config.eos_token_ids = {static_cast<int>(pieces.size())};
  GenerateOptions o;
  o.grammar = compile_json_schema(R"({"type": "boolean"})");
  o.logprobs = 20;  // more than the grammar allows first
  Generation gen(tokenizer, config, o);
  std::vector<float> logits(pieces.size() + 1, 0.0f);
  const auto id_of = [&](const std::string& piece) {
    return static_cast<size_t>(std::find(pieces.begin(), pieces.end(), piece) - pieces.begin());
  };
  logits[id_of("{")] = 9.0f;  // the model's favourites, all forbidden
  logits[id_of("1")] = 8.0f;
  logits[id_of("true")] = 2.0f;
  logits[id_of("false")] = 1.0f;
  const Generation::Step s = gen.next(logits);
  ASSERT_TRUE(s.logprobs.has_value());
  EXPECT_EQ(s.logprobs->chosen.token, static_cast<int32_t>(id_of("true")));
  ASSERT_FALSE(s.logprobs->top.empty());
  EXPECT_LT(s.logprobs->top.size(), 20u);
  double total = 0;
  for (const TokenLogprob& t : s.logprobs->top) {
    const std::string& piece = pieces[static_cast<size_t>(t.token)];
    EXPECT_TRUE(std::string("true").starts_with(piece) || std::string("false").starts_with(piece))
        << piece;
    total += std::exp(static_cast<double>(t.logprob));
  }
  EXPECT_NEAR(total, 1.0, 1e-5);  // every allowed token is listed
  EXPECT_EQ(s.logprobs->top[0].token, s.logprobs->chosen.token);
  EXPECT_NEAR(s.logprobs->chosen.logprob, 2.0 - std::log(std::exp(2.0) + std::exp(1.0) + 2.0),
              1e-5);  // true, false, "t" and "f" (logit 0)
}

TEST(JsonGrammar, NoPromptLookupUnderAGrammar) {
  GenerateOptions o;  // greedy, lookup on
  EXPECT_TRUE(PromptLookup::eligible(o));
  o.grammar = any_json_object();
  EXPECT_FALSE(PromptLookup::eligible(o));  // the Generator and the server's scheduler ask this
}

TEST(JsonGrammar, ResponseFormat) {
  EXPECT_EQ(response_format_grammar(R"({"type": "text"})"), nullptr);
  EXPECT_EQ(response_format_grammar(R"({"type": "json_object"})"), any_json_object());
  // The schema's declared property order survives (objects are emitted in it).
  const auto g = response_format_grammar(R"({"type": "json_schema", "json_schema": {
      "name": "n", "strict": true, "schema": {"type": "object", "properties": {
      "zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
      "required": ["zeta", "alpha"]}}})");
  EXPECT_TRUE(accepts(g, R"({"zeta":1,"alpha":2})"));
  EXPECT_FALSE(accepts(g, R"({"alpha":2,"zeta":1})"));
  const auto construct = [](std::string_view rf) -> std::string {
    try {
      response_format_grammar(rf);
    } catch (const JsonSchemaError& e) {
      return e.construct();
    }
    return "";
  };
  EXPECT_EQ(construct(R"({"type": "yaml"})"), "response_format");
  EXPECT_EQ(construct(R"({"type": "json_schema"})"), "response_format");
  EXPECT_EQ(construct(R"({"type": "json_schema", "json_schema": {"name": "n"}})"),
            "response_format");
  EXPECT_EQ(construct(R"({"type": "json_object", "schema": {}})"), "response_format");
  EXPECT_EQ(construct(R"({"type": "json_schema", "json_schema": {"schema": {"not": {}}}})"), "not");
}

}  // namespace
}  // namespace edgellm

// Hostile schemas: every JsonSchemaLimits budget holds at its boundary and is
// refused one step past it, quickly, naming the limit; bounds the grammar
// cannot meet are refused, not clipped; $ref resolves against resource roots.
namespace edgellm {
namespace {

using Limits = JsonSchemaLimits;

// The message of the JsonSchemaError a schema raises ("" when it compiles).
std::string refusal(std::string_view schema) {
  try {
    compile_json_schema(schema);
  } catch (const JsonSchemaError& e) {
    return e.construct() + ": " + e.what();
  }
  return "";
}

// d0 -> d1 -> ... -> d<links>, the last a string: the root's reference to d0
// is one hop, d<links> is links + 1 hops away. `wrap` shapes each link.
std::string ref_chain(int links, const char* wrap = R"({"$ref": "#/$defs/d%d"})") {
  std::string defs;
  char buf[96];
  for (int i = 0; i < links; ++i) {
    std::snprintf(buf, sizeof(buf), wrap, i + 1);
    defs += "\"d" + std::to_string(i) + "\": " + buf + ", ";
  }
  defs += "\"d" + std::to_string(links) + "\": {\"type\": \"string\"}";
  return R"({"$ref": "#/$defs/d0", "$defs": {)" + defs + "}}";
}

// Time limits hold for a release build; ASan + UBSan at -O1 (make test-sanitize)
// runs nlohmann's parser some 30x slower.
constexpr double kSlowdown = testing::kSanitized ? 40 : 1;

// Milliseconds since t, in release-build terms.
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count() /
         kSlowdown;
}

TEST(JsonSchemaLimits, ReferenceDepth) {
  // At the limit: compiles, and the matcher walks the chain (flattened) to the string.
  const auto at_limit = compile_json_schema(ref_chain(Limits::kMaxRefDepth - 1));
  EXPECT_TRUE(accepts(at_limit, R"("x")"));
  EXPECT_FALSE(accepts(at_limit, "1"));
  const std::string past = refusal(ref_chain(Limits::kMaxRefDepth));
  EXPECT_TRUE(past.starts_with("$ref: ")) << past;
  EXPECT_NE(past.find("1000 $ref hops"), std::string::npos) << past;
  EXPECT_NE(past.find("'#/$defs/d1000'"), std::string::npos) << past;
  // The issue's chains (the 12,000 one crashed the server; 25,000 took 7 s),
  // flat or through arrays: refused in milliseconds, on no deep stack.
  for (const char* wrap :
       {R"({"$ref": "#/$defs/d%d"})", R"({"type": "array", "items": {"$ref": "#/$defs/d%d"}})"})
    for (const int links : {12'000, 25'000}) {
      const std::string schema = ref_chain(links, wrap);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_TRUE(refusal(schema).starts_with("$ref: ")) << links;
      // (~20 ms in a release build; the margin is for sanitized Debug builds)
      EXPECT_LT(ms_since(start), 2000.0) << links << " links, " << schema.size() << " bytes";
    }
}

TEST(JsonSchemaLimits, Nodes) {
  // An enum of n small integers is n literal nodes and one any_of.
  const auto int_enum = [](size_t n) {
    std::string values;
    for (size_t i = 0; i < n; ++i) values += (i ? "," : "") + std::to_string(i % 10);
    return R"({"enum": [)" + values + "]}";
  };
  EXPECT_EQ(refusal(int_enum(Limits::kMaxNodes - 1)), "");
  const std::string past = refusal(int_enum(Limits::kMaxNodes));
  EXPECT_TRUE(past.starts_with("size: ")) << past;
  EXPECT_NE(past.find("250000 grammar nodes"), std::string::npos) << past;
}

TEST(JsonSchemaLimits, LiteralBytes) {
  const std::string mib(1 << 20, 'a');
  const auto string_enum = [&](int n) {
    std::string values;
    for (int i = 0; i < n; ++i) values += std::string(i ? "," : "") + "\"" + mib + "\"";
    return R"({"enum": [)" + values + "]}";
  };
  EXPECT_EQ(refusal(string_enum(7)), "");
  const std::string past = refusal(string_enum(9));
  EXPECT_TRUE(past.starts_with("size: ")) << past.substr(0, 200);
  EXPECT_NE(past.find("8388608 bytes"), std::string::npos) << past.substr(0, 200);
}

TEST(JsonSchemaLimits, Alternatives) {
  // An enum E of n values, and m properties each "E or null": resolving them
  // visits E's n values (E itself, its reference, then n + 1 for each property).
  constexpr size_t n = 100'000;
  const auto schema = [&](int m) {
    std::string values, props;
    for (size_t i = 0; i < n; ++i) values += (i ? "," : "") + std::to_string(i % 10);
    for (int i = 0; i < m; ++i)
      props += std::string(i ? "," : "") + "\"p" + std::to_string(i) +
               R"(": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}]})";
    return R"({"type": "object", "properties": {)" + props + R"(}, "$defs": {"E": {"enum": [)" +
           values + "]}}}";
  };
  static_assert(2 * n + 7 * (n + 1) <= Limits::kMaxAlternatives);
  static_assert(2 * n + 8 * (n + 1) > Limits::kMaxAlternatives);
  EXPECT_EQ(refusal(schema(7)), "");
  const std::string past = refusal(schema(8));
  EXPECT_TRUE(past.starts_with("anyOf: ")) << past;
  EXPECT_NE(past.find("1000000 (the limit)"), std::string::npos) << past;
}

TEST(JsonSchemaLimits, SharedAlternativesExpandOncePerByte) {
  // d_i = anyOf [d_{i+1}, d_{i+1}]: 2^40 paths to the one string, one value to the matcher.
  std::string defs;
  for (int i = 0; i < 40; ++i)
    defs += "\"d" + std::to_string(i) + R"(": {"anyOf": [{"$ref": "#/$defs/d)" +
            std::to_string(i + 1) + R"("}, {"$ref": "#/$defs/d)" + std::to_string(i + 1) +
            "\"}]}, ";
  const std::string schema =
      R"({"$ref": "#/$defs/d0", "$defs": {)" + defs + R"("d40": {"type": "string"}}})";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(accepts(schema, R"("abc")"));
  EXPECT_LT(ms_since(start), 2000.0);
}

TEST(JsonSchemaLimits, Nesting) {
  const auto nested = [](int levels) {
    std::string s = R"({"type": "string"})";
    for (int i = 1; i < levels; ++i) s = R"({"type": "array", "items": )" + s + "}";
    return s;
  };
  EXPECT_EQ(refusal(nested(Limits::kMaxNesting)), "");
  const std::string past = refusal(nested(Limits::kMaxNesting + 1));
  EXPECT_TRUE(past.starts_with("json: ")) << past;
  EXPECT_NE(past.find("deeper than 64"), std::string::npos) << past;
  // 100,000 levels: refused as it is parsed, before anything recurses.
  EXPECT_TRUE(refusal(std::string(100'000, '[') + std::string(100'000, ']')).starts_with("json: "));
}

TEST(JsonSchemaLimits, IntegerBoundsBeyondFifteenDigitsAreRefusedNotClipped) {
  for (const char* bound :
       {R"("minimum": 1e16)", R"("minimum": 1e300)", R"("exclusiveMinimum": 999999999999999)",
        R"("maximum": -1e16)", R"("exclusiveMaximum": -999999999999999)", R"("minimum": 1e16,
                            "maximum": 1e17)"}) {
    const std::string why = refusal(std::string(R"({"type": "integer", )") + bound + "}");
    const std::string keyword = std::string(bound).substr(1, std::string(bound).find('"', 1) - 1);
    EXPECT_TRUE(why.starts_with(keyword + ": ")) << bound << " -> " << why;
    EXPECT_NE(why.find("999999999999999"), std::string::npos) << why;
  }
  // Bounds every emitted integer meets: kept, the grammar's own range applies.
  EXPECT_TRUE(accepts(R"({"type": "integer", "maximum": 1e300})", "999999999999999"));
  EXPECT_TRUE(accepts(R"({"type": "integer", "minimum": -1e300})", "-999999999999999"));
  EXPECT_TRUE(accepts(R"({"type": "integer", "minimum": 999999999999999})", "999999999999999"));
  EXPECT_FALSE(accepts(R"({"type": "integer", "minimum": 999999999999999})", "99999999999999"));
  EXPECT_TRUE(
      accepts(R"({"type": "integer", "exclusiveMaximum": -999999999999998})", "-999999999999999"));
  // An integral constant of any size is emitted as written.
  EXPECT_TRUE(accepts(R"({"type": "integer", "enum": [1e300, 2.5]})", "1e+300"));
  EXPECT_FALSE(accepts(R"({"type": "integer", "enum": [1e300, 2.5]})", "2.5"));
}

TEST(JsonSchemaLimits, CountsBeyondTheLimitNameIt) {
  for (const char* key : {"minLength", "maxLength", "minItems", "maxItems"}) {
    const bool string = std::string_view(key).ends_with("Length");
    const auto schema = [&](int64_t v) {
      return std::string(R"({"type": ")") + (string ? "string" : "array") + R"(", ")" + key +
             "\": " + std::to_string(v) + "}";
    };
    EXPECT_EQ(refusal(schema(Limits::kMaxCount)), "") << key;
    const std::string why = refusal(schema(Limits::kMaxCount + 1));
    EXPECT_TRUE(why.starts_with(std::string(key) + ": ")) << why;
    EXPECT_NE(why.find("1000001 is above 1000000"), std::string::npos) << why;
  }
}

TEST(JsonSchemaLimits, RefsResolveAgainstTheirResourceRoot) {
  // "a" is a schema of its own ($id): its "#/$defs/T" is its T, an integer.
  const char* embedded = R"({"type": "object", "properties": {"a": {"$id": "urn:a",
      "$defs": {"T": {"type": "integer"}}, "$ref": "#/$defs/T"}, "b": {"$ref": "#/$defs/T"}},
      "$defs": {"T": {"type": "string"}}})";
  EXPECT_TRUE(accepts(embedded, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(accepts(embedded, R"({"a":"x"})"));
  EXPECT_FALSE(accepts(embedded, R"({"b":1})"));
  // A pointer into an embedded resource: refs inside it stay its own.
  const char* into = R"({"$ref": "#/$defs/R/properties/v", "$defs": {"R": {"$id": "urn:r",
      "properties": {"v": {"$ref": "#/$defs/T"}}, "$defs": {"T": {"type": "null"}}},
      "T": {"type": "string"}}})";
  EXPECT_TRUE(accepts(into, "null"));
  EXPECT_FALSE(accepts(into, R"("x")"));
  // "#" inside the embedded resource is that resource.
  const char* self = R"({"type": "array", "items": {"$id": "urn:n", "type": "object",
      "properties": {"n": {"$ref": "#"}}}})";
  EXPECT_TRUE(accepts(self, R"([{"n":{"n":{}}}])"));
  EXPECT_FALSE(accepts(self, R"([{"n":[]}])"));
  // Escapes and array indexes in pointers.
  EXPECT_TRUE(accepts(R"({"$ref": "#/$defs/a~1b~0c/anyOf/1", "$defs": {"a/b~c": {"anyOf": [
      {"type": "string"}, {"type": "null"}]}}})",
                      "null"));
  for (const char* bad : {"#/$defs/x/anyOf/01", "#/$defs/x/anyOf/2", "#/$defs/x~2", "#x"})
    EXPECT_TRUE(
        refusal(std::string(R"({"$ref": ")") + bad + R"(", "$defs": {"x": {"anyOf": [{}, {}]}}})")
            .starts_with("$ref: "))
        << bad;
}

TEST(JsonSchemaLimits, ManyKeysCostLinearTime) {
  // nlohmann's ordered_json::parse searched every key linearly: 100,000 keys
  // of one object (a 1 MB body) took 30 s. The schema's parse and its
  // reference lookups are linear now.
  std::string defs;
  for (int i = 0; i < 100'000; ++i)
    defs += "\"d" + std::to_string(i) + "\": {\"type\": \"null\"}, ";
  const std::string schema = R"({"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/d99999"},
      {"$ref": "#/$defs/d5"}]}, "$defs": {)" +
                             defs + R"("x": {}}})";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(accepts(schema, "[null]"));
  EXPECT_LT(ms_since(start), 2000.0) << schema.size() << " bytes";
  // Written order kept; a repeated key keeps its first place and its last value.
  const nlohmann::ordered_json j =
      parse_ordered_json(R"({"b": 1, "a": 2, "b": 3, "c": {"y": 0, "x": 1}})", "test");
  EXPECT_EQ(j.dump(), R"({"b":3,"a":2,"c":{"y":0,"x":1}})");
}

TEST(JsonSchemaLimits, ErrorsAreEdgellmErrors) {
  try {
    compile_json_schema(ref_chain(12'000));
    FAIL();
  } catch (const Error& e) {  // the CLI and the servers catch Error: 'error:' / 400
    EXPECT_NE(std::string(e.what()).find("reference depth"), std::string::npos);
  }
  try {
    response_format_grammar(R"({"type": "json_schema", "json_schema": {"schema":
        {"type": "integer", "minimum": 1e16}}})");
    FAIL();
  } catch (const JsonSchemaError& e) {
    EXPECT_EQ(e.construct(), "minimum");
    EXPECT_TRUE(std::string(e.what()).starts_with("response_format: ")) << e.what();
  }
}

}  // namespace
}  // namespace edgellm
