// Tokenizer and chat template from a .gguf file's own metadata (llama.cpp's
// tokenizer.ggml.* keys), for running a GGUF with nothing beside it. The GGUF
// vocabulary is described as the tokenizer.json HF would hold for it (the one
// scripts/fetch_model.py converts) and built by the same pipeline as a
// tokenizer.json, so BPE, byte-level mapping, added tokens and decoding are
// the same code on both paths.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <tuple>
#include <unordered_set>

#include "edgellm/error.h"
#include "io/gguf.h"
#include "tokenizer_impl.h"

namespace edgellm {

namespace {

using tok::json;

// llama.cpp's llama_token_type.
enum TokenType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// The pre-tokenizers of tokenizer.ggml.pre (convert_hf_to_gguf.py names the
// HF tokenizer it saw), as those HF tokenizers' tokenizer.json states them.
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (gpt-oss): cased words keep a following contraction; "/" joins a punctuation run.
constexpr const char* kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kBpePres = "gpt-2, gpt-4o, llama-bpe, qwen2, smollm";

json byte_level(bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

json split_regex(const char* pattern) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

// Special tokens added around an encoding (add_bos_token / add_eos_token).
json template_processing(const std::vector<std::pair<std::string, int>>& prefix,
                         const std::vector<std::pair<std::string, int>>& suffix) {
  json single = json::array(), specials = json::object();
  auto special = [&](const std::pair<std::string, int>& t) {
    single.push_back({{"SpecialToken", {{"id", t.first}, {"type_id", 0}}}});
    specials[t.first] = {{"id", t.first}, {"ids", {t.second}}, {"tokens", {t.first}}};
  };
  for (const auto& t : prefix) special(t);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (const auto& t : suffix) special(t);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

json added_token(const std::string& content, int id, bool special, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

struct GgufVocab {
  const GgufFile& g;
  std::vector<std::string> tokens;
  std::vector<int> types;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(g.path() + ": metadata '" + key + "' " + what);
  }
  std::optional<int> id(const std::string& key) const {
    const auto v = g.get_int("tokenizer.ggml." + key + "_token_id");
    if (!v) return std::nullopt;
    if (*v < 0 || static_cast<size_t>(*v) >= tokens.size())
      fail("tokenizer.ggml." + key + "_token_id", "holds " + std::to_string(*v) + ", outside the " +
                                                      std::to_string(tokens.size()) + " tokens");
    return static_cast<int>(*v);
  }
  // tokenizer.ggml.add_bos_token / add_eos_token around an encoding.
  json post_processor(bool bos_default) const {
    std::vector<std::pair<std::string, int>> prefix, suffix;
    auto add = [&](const char* flag, const char* key, bool def,
                   std::vector<std::pair<std::string, int>>& out) {
      if (!g.get_int(std::string("tokenizer.ggml.") + flag).value_or(def)) return;
      const auto t = id(key);
      if (!t) fail(std::string("tokenizer.ggml.") + key + "_token_id", "is missing");
      out.emplace_back(tokens[*t], *t);
    };
    add("add_bos_token", "bos", bos_default, prefix);
    add("add_eos_token", "eos", false, suffix);
    if (prefix.empty() && suffix.empty()) return nullptr;
    return template_processing(prefix, suffix);
  }
  std::vector<std::pair<std::string, int32_t>> vocab() const {
    std::vector<std::pair<std::string, int32_t>> out;
    out.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) out.emplace_back(tokens[i], static_cast<int32_t>(i));
    return out;
  }
};

// The pipeline around the model (as tokenizer.json states it) and the model.
struct Pipeline {
  json root;
  tok::BpeSpec bpe;
};

// tokenizer.ggml.model "gpt2": byte-level BPE with the GGUF's merge list.
Pipeline gpt2_tokenizer(const GgufVocab& v) {
  const std::string pre = v.g.get_string("tokenizer.ggml.pre").value_or("gpt-2");
  Pipeline p;
  p.root = {{"version", "1.0"}, {"normalizer", nullptr}, {"decoder", byte_level(true, true)}};
  json& root = p.root;
  if (pre == "smollm") {  // SmolLM2: single digits, then GPT-2's byte-level regex
    root["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true, true)}}};
  } else if (pre == "gpt-2") {
    root["pre_tokenizer"] = byte_level(true, true);
  } else if (pre == "llama-bpe") {  // Llama 3: a piece that is a token is not merged
    root["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", {split_regex(kLlama3Split), byte_level(true, false)}}};
    p.bpe.ignore_merges = true;
  } else if (pre == "gpt-4o") {  // gpt-oss (o200k); merges apply as llama.cpp applies them
    root["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", {split_regex(kGpt4oSplit), byte_level(true, false)}}};
  } else if (pre == "qwen2") {  // Qwen2 / Qwen3: NFC first
    root["normalizer"] = {{"type", "NFC"}};
    root["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", {split_regex(kQwen2Split), byte_level(false, false)}}};
  } else {
    v.fail("tokenizer.ggml.pre", "is '" + pre + "', which edgellm cannot tokenize for a gpt2 " +
                                     "vocabulary (supported: " + kBpePres + ")");
  }
  p.bpe.vocab = v.vocab();
  // Merges into tokens past the embedding (a trimmed vocabulary) cannot apply.
  const std::unordered_set<std::string_view> known(v.tokens.begin(), v.tokens.end());
  for (const std::string& m : v.g.get_string_array("tokenizer.ggml.merges")) {
    const size_t sp = m.find(' ');
    if (sp == std::string::npos) continue;
    std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    if (!known.count(left) || !known.count(right)) continue;
    p.bpe.merges.emplace_back(std::move(left), std::move(right));
  }
  json added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] == kControl) added.push_back(added_token(v.tokens[i], i, true, false));
    if (v.types[i] == kUserDefined) added.push_back(added_token(v.tokens[i], i, false, false));
  }
  root["added_tokens"] = std::move(added);
  root["post_processor"] = v.post_processor(false);
  return p;
}

// tokenizer.ggml.model "llama": SentencePiece-style BPE with byte fallback
// (Gemma). The GGUF has scores, no merges: SentencePiece merges the adjacent
// pair whose concatenation is the best-scoring normal piece, so ranking every
// split of each normal piece by that piece's score (transformers'
// generate_merges) is an equivalent merge list.
Pipeline spm_tokenizer(GgufVocab& v) {
  if (v.g.get_int("tokenizer.ggml.add_space_prefix").value_or(0))
    v.fail("tokenizer.ggml.add_space_prefix",
           "is true (a SentencePiece dummy prefix, as in Llama 2), which edgellm does not "
           "support; Gemma-style vocabularies without it are");
  const std::vector<double> scores = v.g.get_number_array("tokenizer.ggml.scores");
  if (scores.size() < v.tokens.size())
    v.fail("tokenizer.ggml.scores", "must hold one score per token");
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (!(std::fabs(scores[i]) <= std::numeric_limits<float>::max()))
      v.fail("tokenizer.ggml.scores",
             "holds a score that is not a finite float at " + std::to_string(i));
  // llama.cpp writes user-defined whitespace pieces with spaces; SentencePiece
  // matches them after the ' ' -> '▁' normalization, so they get '▁' back.
  const std::string space = "\xE2\x96\x81";  // ▁
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] != kUserDefined) continue;
    std::string& t = v.tokens[i];
    for (size_t p = t.find(' '); p != std::string::npos; p = t.find(' ', p + space.size()))
      t.replace(p, 1, space);
  }
  if (std::unordered_set<std::string_view>(v.tokens.begin(), v.tokens.end()).size() !=
      v.tokens.size())
    v.fail("tokenizer.ggml.tokens", "holds the same token string twice");
  tok::TokenMap normal;
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.types[i] == kNormal) normal.emplace(v.tokens[i], static_cast<int32_t>(i));
  // (-score, piece id, left, right): transformers' order, ties by id then text.
  std::vector<std::tuple<float, int32_t, std::string_view, std::string_view>> ranked;
  for (const auto& [piece, id] : normal) {
    const std::string_view p = piece;
    for (size_t cut = 1; cut < p.size(); ++cut) {
      if (normal.find(p.substr(0, cut)) == normal.end() ||
          normal.find(p.substr(cut)) == normal.end())
        continue;
      ranked.emplace_back(-static_cast<float>(scores[id]), id, p.substr(0, cut), p.substr(cut));
    }
  }
  std::sort(ranked.begin(), ranked.end());

  Pipeline pl;
  pl.bpe.merges.reserve(ranked.size());
  for (const auto& [score, id, left, right] : ranked) pl.bpe.merges.emplace_back(left, right);
  pl.bpe.vocab = v.vocab();
  if (const auto unk = v.id("unknown")) pl.bpe.unk_token = v.tokens[*unk];
  pl.bpe.fuse_unk = true;
  pl.bpe.byte_fallback = true;
  json added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] == kControl) added.push_back(added_token(v.tokens[i], i, true, false));
    if (v.types[i] == kUserDefined)
      added.push_back(
          added_token(v.tokens[i], i, false, v.tokens[i].find(space) != std::string::npos));
  }
  pl.root = {
      {"version", "1.0"},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"added_tokens", std::move(added)},
      {"post_processor", v.post_processor(true)}};
  return pl;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const std::filesystem::path& gguf_file) {
  const GgufFile g = GgufFile::open(gguf_file);
  GgufVocab v{g, g.get_string_array("tokenizer.ggml.tokens"), {}};
  if (v.tokens.empty()) v.fail("tokenizer.ggml.tokens", "is missing");
  const std::vector<double> types = g.get_number_array("tokenizer.ggml.token_type");
  if (!types.empty() && types.size() != v.tokens.size())
    v.fail("tokenizer.ggml.token_type", "must hold one type per token");
  v.types.assign(v.tokens.size(), kNormal);
  for (size_t i = 0; i < types.size(); ++i) {
    if (!(types[i] >= 0 && types[i] <= static_cast<double>(kByte) &&
          types[i] == std::floor(types[i])))
      v.fail("tokenizer.ggml.token_type", "holds " + std::to_string(types[i]) + " at " +
                                              std::to_string(i) +
                                              ", not a llama.cpp token type (0-6)");
    v.types[i] = static_cast<int>(types[i]);
  }
  // Tokens past the embedding's rows have no vector: the vocabulary ends there.
  if (const GgufTensor* e = g.find("token_embd.weight"); e && e->dims.size() == 2) {
    v.tokens.resize(std::min<size_t>(v.tokens.size(), e->dims[1]));
    v.types.resize(v.tokens.size());
  }
  const auto model = g.get_string("tokenizer.ggml.model");
  if (!model) v.fail("tokenizer.ggml.model", "is missing");
  Pipeline p;
  if (*model == "gpt2")
    p = gpt2_tokenizer(v);
  else if (*model == "llama")
    p = spm_tokenizer(v);
  else
    v.fail("tokenizer.ggml.model",
           "is '" + *model + "', which edgellm cannot tokenize (supported: " + "gpt2, llama)");
  // Nothing left for tokenizer_config.json to change: the pipeline above is final.
  auto bpe = tok::make_bpe(std::move(p.bpe), g.path() + ": tokenizer.ggml.tokens/merges");
  return Tokenizer(
      Impl::build(std::move(p.root), json::object(), g.path(), g.path(), std::move(bpe)));
}

ChatTemplate ChatTemplate::from_gguf(const std::filesystem::path& gguf_file) {
  const GgufFile g = GgufFile::open(gguf_file);
  const std::string tmpl = g.get_string("tokenizer.chat_template").value_or("");
  std::string bos;  // Gemma / Llama 3 templates start with it
  const auto id = g.get_int("tokenizer.ggml.bos_token_id");
  if (!tmpl.empty() && id) {
    const std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
    if (*id >= 0 && static_cast<size_t>(*id) < tokens.size()) bos = tokens[*id];
  }
  return from_text(tmpl, bos, g.path() + ": metadata 'tokenizer.chat_template'");
}

}  // namespace edgellm
