#include "embeddings_route.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "api_error.h"
#include "edgellm/pooling.h"

namespace edgellm {

using json = nlohmann::json;

// `user` never changes the output (server.cpp checks its type).
const std::set<std::string> kEmbeddingFields = {"model", "input", "dimensions", "encoding_format",
                                                "user"};
const std::set<std::string> kRerankFields = {"model", "query", "documents", "top_n"};

namespace {

// OpenAI's encoding_format "base64": the float32 values' little-endian bytes.
std::string base64_floats(const std::vector<float>& values) {
  static_assert(std::endian::native == std::endian::little, "float32 bytes are sent as stored");
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < 3; ++k)
      chunk = chunk << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(chunk >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

bool is_token_list(const json& v) {
  return v.is_array() && !v.empty() &&
         std::all_of(v.begin(), v.end(), [](const json& t) { return t.is_number_integer(); });
}

// OpenAI's `input`: a string, a list of strings, one token-id list, or a list
// of token-id lists. Texts are tokenized as HF `tokenizer(text)` does (with
// the special tokens its post-processor adds: Qwen3-Embedding's end token).
std::vector<std::vector<int32_t>> embedding_inputs(const json& input, const Tokenizer& tokenizer) {
  const char* shape = "'input' must be a string, a list of strings, or a list of token-id lists";
  if (input.is_string()) return {tokenizer.encode(input.get<std::string>(), true)};
  if (!input.is_array()) bad("input", shape);
  const json list = is_token_list(input) ? json::array({input}) : input;
  if (list.size() > kMaxPoolingInputs)  // before tokenizing any of them
    bad("input", std::to_string(list.size()) + " inputs: at most " +
                     std::to_string(kMaxPoolingInputs) + " per request");
  std::vector<std::vector<int32_t>> out;
  for (const json& item : list) {
    if (item.is_string()) {
      out.push_back(tokenizer.encode(item.get<std::string>(), true));
    } else if (item.is_array() && std::all_of(item.begin(), item.end(), [](const json& t) {
                 return t.is_number_integer() && t.get<int64_t>() >= INT32_MIN &&
                        t.get<int64_t>() <= INT32_MAX;
               })) {
      out.push_back(item.get<std::vector<int32_t>>());
    } else {
      bad("input", shape);
    }
  }
  return out;
}

}  // namespace

Context& PoolingRoutes::context() {
  if (!context_.ready()) context_ = Context(model_);
  return context_;
}

json PoolingRoutes::embeddings(const json& body, const std::string& model_name) {
  const auto input = body.find("input");
  if (input == body.end() || input->is_null()) bad("input", "missing required field 'input'");
  std::optional<int> dimensions;
  if (const auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer()) bad("dimensions", "'dimensions' must be an integer");
    // The engine bounds it by the hidden size; this only keeps it an int.
    dimensions = static_cast<int>(std::clamp<int64_t>(d->get<int64_t>(), INT32_MIN, INT32_MAX));
  }
  std::string format = "float";
  if (const auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    format = f->get<std::string>();
  }
  const std::vector<std::vector<int32_t>> inputs = embedding_inputs(*input, model_.tokenizer());
  std::vector<std::vector<float>> vectors;
  {
    const std::lock_guard lock(mutex_);
    vectors = embed(context(), inputs, dimensions);
  }
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i)
    data.push_back(
        {{"object", "embedding"},
         {"index", i},
         {"embedding", format == "base64" ? json(base64_floats(vectors[i])) : json(vectors[i])}});
  size_t tokens = 0;
  for (const auto& ids : inputs) tokens += ids.size();
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model_name},
          {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

json PoolingRoutes::rerank(const json& body, const std::string& model_name) {
  const auto query = body.find("query");
  if (query == body.end() || query->is_null()) bad("query", "missing required field 'query'");
  if (!query->is_string()) bad("query", "'query' must be a string");
  const auto docs = body.find("documents");
  if (docs == body.end() || docs->is_null()) bad("documents", "missing required field 'documents'");
  if (!docs->is_array() ||
      !std::all_of(docs->begin(), docs->end(), [](const json& d) { return d.is_string(); }))
    bad("documents", "'documents' must be a list of strings");
  std::optional<int64_t> top_n;  // the engine bounds it
  if (const auto t = body.find("top_n"); t != body.end() && !t->is_null()) {
    if (!t->is_number_integer()) bad("top_n", "'top_n' must be an integer");
    top_n = t->is_number_unsigned()
                ? static_cast<int64_t>(std::min<uint64_t>(t->get<uint64_t>(), INT64_MAX))
                : t->get<int64_t>();
  }
  const std::vector<std::string> documents = docs->get<std::vector<std::string>>();
  Ranking ranking;
  {
    const std::lock_guard lock(mutex_);
    ranking = edgellm::rerank(context(), query->get<std::string>(), documents, top_n);
  }
  json results = json::array();
  for (const RankedDocument& r : ranking.results)
    results.push_back({{"index", r.index}, {"relevance_score", r.relevance_score}});
  const size_t tokens = ranking.prompt_tokens;
  return {{"object", "list"},
          {"model", model_name},
          {"results", std::move(results)},
          {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace edgellm
