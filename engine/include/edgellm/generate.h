// The one generation loop: prompt tokens in; sampler, stop tokens and
// strings, a max-token count, a streaming callback and a cancel flag.
//
// Generation is the per-token bookkeeping (sample, stop, stream the text);
// generate() drives it over one Context (CLI, chat, bench, embedding), and the
// server's scheduler drives many of them over one batched decode step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edgellm/session.h"

namespace edgellm {

struct GenerateOptions {
  int max_tokens = 100;  // generated tokens at most (the context may end it sooner)
  SamplerOptions sampling;
  bool stop_at_eos = true;                    // the model's EOS ids end the generation
  std::vector<int32_t> stop_tokens;           // more ids that end it (not part of the output)
  std::vector<std::string> stop_strings;      // text that ends it (cut from the output)
  const std::atomic<bool>* cancel = nullptr;  // set from any thread to stop before the next token
};

enum class FinishReason { none, stop, length, cancelled };
// "stop", "length", "cancelled" (OpenAI's finish_reason values for the first two).
const char* finish_reason_name(FinishReason reason);

class Generation {
 public:
  Generation(const Tokenizer& tokenizer, const ModelConfig& config, GenerateOptions options);

  struct Step {
    int32_t token = -1;  // the sampled id (-1 when cancelled); not in tokens() when it stopped
    std::string text;    // text that became final: nothing that could still start a stop string
    bool done = false;
  };
  // Samples the token that follows `logits` and applies the stop rules.
  Step next(std::span<const float> logits);
  // Ends the generation from outside (context full, client gone): flushes the text held back.
  Step finish(FinishReason reason);

  bool done() const { return finish_ != FinishReason::none; }
  FinishReason finish_reason() const { return finish_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // generated, stops excluded
  const std::string& text() const { return text_; }               // all text returned so far

 private:
  Step emit(int32_t token, bool flush);

  const ModelConfig* config_;
  GenerateOptions options_;
  Sampler sampler_;
  StreamDecoder stream_;
  std::vector<int32_t> tokens_;
  std::string pending_;  // decoded, held back while it may begin a stop string
  std::string text_;
  FinishReason finish_ = FinishReason::none;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, stop token / EOS excluded
  std::string text;             // their text, cut before a stop string
  FinishReason finish = FinishReason::none;
  size_t prompt_tokens = 0;
  double ttft_ms = 0;    // prefill + the first token
  double decode_ms = 0;  // the decode steps after it
  int decode_steps = 0;
};

// Called with each step's token and its final text; return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::string_view text)>;

// Prefills `prompt` at start_pos (earlier positions must already be in the
// context's cache) and generates until a stop rule, max_tokens, the end of the
// context, a cancel or the callback says stop.
GenerateResult generate(Context& context, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token = {},
                        int start_pos = 0);

}  // namespace edgellm
