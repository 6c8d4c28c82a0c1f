// The one generation loop: prompt tokens in; sampler, stop tokens and
// strings, a max-token count, a streaming callback and a cancel flag.
//
// Generation is the per-token bookkeeping (sample, stop, stream the text);
// Generator drives it over one Context one engine step at a time (the Python
// iterator), generate() runs a Generator to the end and times it (CLI, chat,
// bench, the verify runner), and the server's scheduler drives many
// Generations over one batched decode step.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edgellm/json_grammar.h"
#include "edgellm/session.h"

namespace edgellm {

struct GenerateOptions {
  int max_tokens = 100;  // generated tokens at most (the context may end it sooner)
  SamplerOptions sampling;
  bool stop_at_eos = true;                    // the model's EOS ids end the generation
  std::vector<int32_t> stop_tokens;           // more ids that end it (not part of the output)
  std::vector<std::string> stop_strings;      // text that ends it (cut from the output)
  const std::atomic<bool>* cancel = nullptr;  // set from any thread to stop before the next token
  // Benchmarks (--ignore-eos): after a stop (EOS, stop token or string) keep
  // decoding, unseen, until max_tokens tokens were sampled, so that the timing
  // covers them all. The output still ends at the stop. Generator only.
  bool decode_past_stop = false;
  // Called with the logits of every sampled token and the token (stop tokens
  // and unseen ones included), before the stop rules: the verify gate's
  // per-step records.
  std::function<void(std::span<const float> logits, int32_t token)> on_sample;
  // >= 0: each output token's Step carries its log-probability and this many
  // most likely alternatives (OpenAI's logprobs / top_logprobs); -1 = off.
  // Under a grammar they are those of the masked distribution (what was
  // sampled from): every alternative is a token the grammar allowed.
  int logprobs = -1;
  // Diagnosis: the prefill's per-layer outputs (Generator only).
  PrefillCapture* capture = nullptr;
  // Prompt-lookup decoding (greedy only, Generator only): drafts copied from an
  // earlier occurrence of the latest n-gram in prompt + output are verified in
  // one decode batch (Context::decode_rows), whose rows equal decode steps bit
  // for bit, so the output is token for token that of plain decoding.
  bool lookup = true;
  // Structured output: every sampled token keeps the output a prefix of a
  // document this grammar accepts (a mask before sampling, so penalties,
  // top-k/p and min-p see only the allowed tokens). EOS and stop tokens are
  // allowed only when the document is complete; a complete document that
  // nothing may extend ends the generation ("stop"). Turns lookup off.
  std::shared_ptr<const JsonGrammar> grammar;
  // A reasoning model's reply (edgellm/reasoning.h): `grammar` binds only after
  // the reasoning block, and a budget >= 0 closes the block (kThinkClose's
  // tokens forced in) once it holds that many tokens.
  // A harmony reply (gpt-oss, edgellm/harmony.h) keeps its markers in the text
  // (kHarmonyMarkers: special tokens, the reply's structure); the block
  // is everything before the final channel's header (kHarmonyFinal), which the
  // grammar binds after and the budget forces in.
  struct Reasoning {
    bool enabled = false;  // the template lays out reasoning blocks
    bool started = false;  // the prompt opened the block (harmony: an analysis body)
    int budget = -1;       // -1: the model closes it
    bool harmony = false;  // the template writes harmony (ChatTemplate::harmony)
  } reasoning;
};

struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first
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
    // With options.logprobs >= 0, for a token of the output (not a stop token):
    // its log-probability and the options.logprobs most likely tokens.
    std::optional<TokenLogprobs> logprobs;
  };
  // Samples the token that follows `logits` and applies the stop rules.
  Step next(std::span<const float> logits);
  // Ends the generation from outside (context full, client gone): flushes the text held back.
  Step finish(FinishReason reason);
  // After a stop with decode_past_stop: samples the next token, unseen.
  int32_t next_unseen(std::span<const float> logits);

  bool done() const { return finish_ != FinishReason::none; }
  FinishReason finish_reason() const { return finish_; }
  // The stop string that ended it (the earliest in the text); empty otherwise.
  const std::string& stop_string() const { return stop_string_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // generated, stops excluded
  const std::string& text() const { return text_; }               // all text returned so far
  int sampled() const { return sampled_; }  // tokens sampled: output, stop and unseen ones
  const GenerateOptions& options() const { return options_; }

 private:
  Step emit(int32_t token, bool flush);
  // The logits with every token the grammar forbids at -inf (empty: none
  // allowed); `also` (>= 0) is allowed beside them.
  std::span<const float> constrain(std::span<const float> logits, int32_t also = -1);
  // Follows the reasoning block through a token's text `piece`; forces the
  // close past the budget. Returns the text past the close that starts the
  // answer (for the grammar), when this piece closed it.
  std::string track_reasoning(const std::string& piece);
  void force_close();  // the next tokens are the close's

  const ModelConfig* config_;
  struct Constraint;                        // the grammar's matcher and mask (generate.cpp)
  std::shared_ptr<Constraint> constraint_;  // null without options.grammar
  GenerateOptions options_;
  Sampler sampler_;
  StreamDecoder stream_;
  std::vector<int32_t> tokens_;
  std::string pending_;  // decoded, held back while it may begin a stop string
  std::string text_;
  int sampled_ = 0;
  FinishReason finish_ = FinishReason::none;
  std::string stop_string_;
  // The reasoning block (options_.reasoning): where the reply is, the block's
  // text not yet searched for the close, its tokens, the tokens to force.
  enum class Phase { answer, undecided, thinking };
  Phase phase_ = Phase::answer;
  std::string thought_;
  int thought_tokens_ = 0;
  int32_t open_token_ = -1;  // kThinkOpen as one token (-1: none)
  std::vector<int32_t> close_tokens_;
  std::deque<int32_t> forced_;
  bool closing_ = false;  // the close was forced in
  // Harmony: the block ends at kHarmonyFinal; the budget's close depends on
  // where the reply is (in a body, or before any header).
  std::string_view close_marker_;
  bool in_body_ = false;
  const Tokenizer* tokenizer_;
};

// Prompt-lookup decoding for one greedy sequence: n-gram drafts copied from
// the context, verified in one decode batch (Context::decode_rows), whose rows
// equal decode steps bit for bit, so the output is token for token that of
// plain decoding. The Generator and the server's scheduler (a lone decoding
// stream) share it.
class PromptLookup {
 public:
  // Whether a generation with these options may draft (greedy, lookup on, no grammar).
  static bool eligible(const GenerateOptions& options);

  // The tokens that followed the latest earlier occurrence of the history's
  // last n-gram (n = 3..1), where the history is the prompt, then the output
  // (whose last token is the one the next forward runs); at most `limit` and
  // the adaptive draft length. Empty when there is none, or while resting.
  std::vector<int32_t> draft(std::span<const int32_t> prompt, std::span<const int32_t> output,
                             int limit) const;

  // Runs one forward over [last, draft...] at the context's position and feeds
  // its rows to `gen` until one disagrees with the draft or the generation
  // stops: the returned steps (at least one) are those plain decoding would
  // have produced. The context keeps the KV of the rows they ran (its position
  // advances by steps.size()); the rejected rows are rewound.
  std::vector<Generation::Step> verify(Context& context, Generation& gen, int32_t last,
                                       std::span<const int32_t> draft);

  // A plain decode step took `ms` (what a draft must beat); counts down a rest.
  void plain_step(double ms);

  int drafted() const { return drafted_; }    // draft tokens verified
  int accepted() const { return accepted_; }  // of them, the ones kept

 private:
  static constexpr int kMaxDraft = 15;
  int draft_len_ = 4;  // adaptive, 1..kMaxDraft
  int misses_ = 0;     // drafts in a row that did not pay
  int pause_ = 0;      // steps left without drafting
  static constexpr int kMinRest = 16, kMaxRest = 512;
  int rest_ = kMinRest;  // the next rest's length
  double step_ms_ = 0;   // a plain decode step's time (moving average)
  int drafted_ = 0;
  int accepted_ = 0;
  std::vector<float> logits_;  // [draft + 1][vocab]
};

// One generation over one Context, one engine step per step(): the first
// prefills the prompt at start_pos, each later one runs one decode step at the
// context's position. Positions [0, start_pos) must already be in the context's
// cache (start_pos <= context.position()); the ones after are discarded.
class Generator {
 public:
  Generator(Context& context, std::vector<int32_t> prompt, GenerateOptions options,
            int start_pos = 0);

  // Runs the next engine step and returns what it produced; a step past a stop
  // (decode_past_stop) returns its token with no text. Throws when done().
  Generation::Step step();
  // Ends the generation from outside (the caller's consumer stopped).
  Generation::Step cancel() {
    queued_.clear();
    return gen_.finish(FinishReason::cancelled);
  }
  // The next step() returns output (not an unseen step past a stop).
  bool next_seen() const { return !queued_.empty() || !gen_.done(); }
  // The consumer stopped after a stop already generated: drop the rest.
  void drop_queued() { queued_.clear(); }

  // No step left: the generation finished (and no unseen decoding is due).
  bool done() const;
  const Generation& generation() const { return gen_; }
  int position() const { return context_->position(); }  // the context's: [0, pos) are cached
  int decode_steps() const { return decode_steps_; }     // tokens decoded after the prefill's
  int drafted() const { return lookup_.drafted(); }      // lookup draft tokens verified
  int accepted() const { return lookup_.accepted(); }    // of them, the ones kept

 private:
  Context* context_;
  std::vector<int32_t> prompt_;
  Generation gen_;
  int32_t last_ = -1;  // the token the next decode step runs
  bool started_ = false;
  int decode_steps_ = 0;
  std::deque<Generation::Step> queued_;  // steps of a verified draft not yet returned
  PromptLookup lookup_;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, stop token / EOS excluded
  std::string text;             // their text, cut before a stop string
  FinishReason finish = FinishReason::none;
  size_t prompt_tokens = 0;
  double ttft_ms = 0;    // prefill + the first token
  double decode_ms = 0;  // the decode steps after it (unseen ones included)
  int decode_steps = 0;
  int end_pos = 0;  // the context's position afterwards: [0, end_pos) are in its cache
};

// Called with each step's token and its final text; return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::string_view text)>;

// Prefills `prompt` at start_pos (positions [0, start_pos) must already be in
// the context's cache) and generates until a stop rule, max_tokens, the end of the
// context, a cancel or the callback says stop. `on_token` sees every token of
// the output (not the unseen ones of decode_past_stop). The timing is the
// seed's: ttft_ms is the prefill and the first token's sampling, decode_ms the
// decode steps after it; constructing the Generator happens before the clock.
GenerateResult generate(Context& context, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token = {},
                        int start_pos = 0);

}  // namespace edgellm
