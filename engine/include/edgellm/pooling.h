// Embedding and reranker models on the production prefill: a decoder-only
// model's last position read as a vector (Qwen3-Embedding's last-token
// pooling) or as a yes/no verdict (Qwen3-Reranker). Every input runs in
// Context::prefill_packed, several side by side per forward pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edgellm/session.h"

namespace edgellm {

// At most this many inputs (texts, or documents to rank) per call: OpenAI's
// limit on one embeddings request.
inline constexpr size_t kMaxPoolingInputs = 2048;

// Each input's last-position hidden state after the final norm, L2-normalised.
// `dimensions` keeps the first `dimensions` values and normalises again
// (Qwen3-Embedding's Matryoshka truncation); none keeps all of hidden_size.
// Error: no inputs, more than kMaxPoolingInputs, an empty input, one longer
// than the context, a token id outside the vocabulary, `dimensions` outside
// [1, hidden_size].
std::vector<std::vector<float>> embed(Context& context,
                                      std::span<const std::vector<int32_t>> inputs,
                                      std::optional<int> dimensions = std::nullopt);

// Each input's logits at its last position, of `tokens` only:
// [inputs][tokens.size()]. The same bounds as embed().
std::vector<std::vector<float>> last_token_logits(Context& context,
                                                  std::span<const std::vector<int32_t>> inputs,
                                                  std::span<const int32_t> tokens);

// Qwen3-Reranker's default <Instruct>.
inline constexpr std::string_view kDefaultRerankInstruction =
    "Given a web search query, retrieve relevant passages that answer the query";

// Qwen3-Reranker's prompt for one (query, document) pair, as its model card
// writes it: a ChatML system turn asking for "yes" or "no", the user turn
// "<Instruct>: ...\n<Query>: ...\n<Document>: ...", and the assistant turn
// opened with an empty think block. The query, document and instruction are
// plain text: marker text inside them is not read as special tokens.
std::vector<int32_t> rerank_prompt(const Tokenizer& tokenizer, std::string_view query,
                                   std::string_view document, std::string_view instruction);

// Each document's relevance to `query`: p("yes") of softmax over the "yes"
// and "no" logits at the end of its pair prompt (Qwen3-Reranker).
std::vector<float> rerank_scores(Context& context, std::string_view query,
                                 std::span<const std::string> documents,
                                 std::string_view instruction = kDefaultRerankInstruction);

struct RankedDocument {
  size_t index = 0;  // in the request's documents
  float relevance_score = 0.0f;
};
struct Ranking {
  std::vector<RankedDocument> results;  // highest score first; ties keep the documents' order
  size_t prompt_tokens = 0;             // of all the pair prompts
};
// The documents by rerank_scores(), the first `top_n` (none: all; more than
// there are: all). Error: the vocabulary lacks a "yes" or "no" token, no
// documents or more than kMaxPoolingInputs, top_n < 1, or embed()'s bounds on
// the prompts (one longer than the context).
Ranking rerank(Context& context, std::string_view query, std::span<const std::string> documents,
               std::optional<int64_t> top_n = std::nullopt,
               std::string_view instruction = kDefaultRerankInstruction);

}  // namespace edgellm
