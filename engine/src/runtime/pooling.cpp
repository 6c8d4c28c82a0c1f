#include "edgellm/pooling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "edgellm/error.h"

namespace edgellm {

namespace {

// Refuses what no forward pass should start on, each with its own message.
void check_inputs(const Context& context, std::span<const std::vector<int32_t>> inputs) {
  if (inputs.empty()) throw Error("no inputs: give at least one");
  if (inputs.size() > kMaxPoolingInputs)
    throw Error(std::to_string(inputs.size()) + " inputs: at most " +
                std::to_string(kMaxPoolingInputs) + " per request");
  const size_t context_size = static_cast<size_t>(context.max_context());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) throw Error("input " + std::to_string(i) + " is empty (no tokens)");
    if (inputs[i].size() > context_size)
      throw Error("input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                  " tokens, more than the context of " + std::to_string(context_size));
  }
}

// Runs `inputs` in as few packed prefills as the context holds, filling
// hidden [inputs][H] and, when `with_logits`, logits [inputs][V].
void run_packed(Context& context, std::span<const std::vector<int32_t>> inputs,
                std::vector<float>& hidden, std::vector<float>& logits, bool with_logits) {
  const size_t H = static_cast<size_t>(context.config().hidden_size);
  const size_t V = static_cast<size_t>(context.config().vocab_size);
  const size_t capacity = static_cast<size_t>(context.max_context());
  hidden.assign(inputs.size() * H, 0.0f);
  if (with_logits) logits.assign(inputs.size() * V, 0.0f);
  std::vector<std::span<const int32_t>> pass;
  size_t first = 0, tokens = 0;
  const auto flush = [&] {
    const size_t n = pass.size();
    context.prefill_packed(
        pass, std::span(hidden).subspan(first * H, n * H),
        with_logits ? std::span(logits).subspan(first * V, n * V) : std::span<float>());
    first += n;
    pass.clear();
    tokens = 0;
  };
  for (const std::vector<int32_t>& input : inputs) {
    if (tokens + input.size() > capacity) flush();
    pass.emplace_back(input);
    tokens += input.size();
  }
  flush();
}

void normalize(std::span<float> v) {
  double sum = 0.0;
  for (float x : v) sum += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum);
  if (norm == 0.0) return;  // a zero vector stays zero (no NaN)
  for (float& x : v) x = static_cast<float>(x / norm);
}

}  // namespace

std::vector<std::vector<float>> embed(Context& context,
                                      std::span<const std::vector<int32_t>> inputs,
                                      std::optional<int> dimensions) {
  const int H = context.config().hidden_size;
  if (dimensions && (*dimensions < 1 || *dimensions > H))
    throw Error("dimensions " + std::to_string(*dimensions) + " is outside [1, " +
                std::to_string(H) + "] (the model's hidden size)");
  check_inputs(context, inputs);
  std::vector<float> hidden, unused;
  run_packed(context, inputs, hidden, unused, false);
  const size_t keep = static_cast<size_t>(dimensions.value_or(H));
  std::vector<std::vector<float>> out;
  out.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const float* row = &hidden[i * static_cast<size_t>(H)];
    std::vector<float> v(row, row + keep);
    normalize(v);  // after the truncation: a shortened vector is unit length too
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<std::vector<float>> last_token_logits(Context& context,
                                                  std::span<const std::vector<int32_t>> inputs,
                                                  std::span<const int32_t> tokens) {
  const int32_t V = context.config().vocab_size;
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  check_inputs(context, inputs);
  std::vector<float> hidden, logits;
  run_packed(context, inputs, hidden, logits, true);
  std::vector<std::vector<float>> out(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int32_t t : tokens) out[i].push_back(logits[i * static_cast<size_t>(V) + t]);
  return out;
}

std::vector<int32_t> rerank_prompt(const Tokenizer& tokenizer, std::string_view query,
                                   std::string_view document, std::string_view instruction) {
  // Qwen3-Reranker's model card, verbatim: prefix, format_instruction(), suffix.
  std::string text =
      "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
      "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
      "<|im_end|>\n<|im_start|>user\n";
  std::vector<TextSpan> plain;
  const auto append_plain = [&](std::string_view label, std::string_view value) {
    text += label;
    plain.push_back({text.size(), text.size() + value.size()});
    text += value;
  };
  append_plain("<Instruct>: ", instruction);
  append_plain("\n<Query>: ", query);
  append_plain("\n<Document>: ", document);
  text += "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return tokenizer.encode(text, false, plain);
}

namespace {

// Qwen3-Reranker's pair prompts, checked before any is tokenized.
std::vector<std::vector<int32_t>> rerank_prompts(const Tokenizer& tokenizer, std::string_view query,
                                                 std::span<const std::string> documents,
                                                 std::string_view instruction) {
  if (documents.empty()) throw Error("no documents: give at least one");
  if (documents.size() > kMaxPoolingInputs)
    throw Error(std::to_string(documents.size()) + " documents: at most " +
                std::to_string(kMaxPoolingInputs) + " per request");
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(documents.size());
  for (const std::string& d : documents)
    prompts.push_back(rerank_prompt(tokenizer, query, d, instruction));
  return prompts;
}

std::vector<float> p_yes(Context& context, std::span<const std::vector<int32_t>> prompts) {
  const Tokenizer& tokenizer = context.tokenizer();
  const int32_t yes = tokenizer.token_to_id("yes"), no = tokenizer.token_to_id("no");
  if (yes < 0 || no < 0)
    throw Error(
        "this model's vocabulary has no \"yes\" or \"no\" token: it cannot score as a "
        "yes/no reranker (Qwen3-Reranker)");
  const int32_t pair[] = {yes, no};
  std::vector<float> scores;
  for (const std::vector<float>& l : last_token_logits(context, prompts, pair))
    // softmax over the two logits: 1 / (1 + e^(no - yes))
    scores.push_back(static_cast<float>(1.0 / (1.0 + std::exp(static_cast<double>(l[1]) - l[0]))));
  return scores;
}

}  // namespace

std::vector<float> rerank_scores(Context& context, std::string_view query,
                                 std::span<const std::string> documents,
                                 std::string_view instruction) {
  return p_yes(context, rerank_prompts(context.tokenizer(), query, documents, instruction));
}

Ranking rerank(Context& context, std::string_view query, std::span<const std::string> documents,
               std::optional<int64_t> top_n, std::string_view instruction) {
  if (top_n && *top_n < 1) throw Error("top_n " + std::to_string(*top_n) + " must be >= 1");
  const std::vector<std::vector<int32_t>> prompts =
      rerank_prompts(context.tokenizer(), query, documents, instruction);
  const std::vector<float> scores = p_yes(context, prompts);
  Ranking out;
  for (const std::vector<int32_t>& p : prompts) out.prompt_tokens += p.size();
  for (size_t i = 0; i < scores.size(); ++i) out.results.push_back({i, scores[i]});
  std::stable_sort(out.results.begin(), out.results.end(),
                   [](const RankedDocument& a, const RankedDocument& b) {
                     return a.relevance_score > b.relevance_score;
                   });
  if (top_n && static_cast<uint64_t>(*top_n) < out.results.size())
    out.results.resize(static_cast<size_t>(*top_n));
  return out;
}

}  // namespace edgellm
