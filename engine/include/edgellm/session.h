// The engine's contract: setup once, then prefill and decode_step. The
// inference programs, `make profile`, the chat REPL and the verify adapters all
// call these same functions; there is no second forward pass.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "edgellm/config.h"
#include "edgellm/exec_config.h"
#include "edgellm/profile.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

struct SessionOptions {
  int threads = 0;         // <= 0: one per hardware thread; at most 4 per hardware thread
  int max_context = 4096;  // KV cache positions; capped by the model's limit and by memory
  bool profile = false;    // per-kernel timing (costs nothing when off)
  // Matrices as stored (""), or a bf16 checkpoint's matrices quantized at
  // setup: "q8_0" or "q4_0" (kernels/quant.h).
  std::string weights;
  // The arithmetic (runtime/exec_config.cpp), resolved once at setup and kept
  // with the model. "fast" (default): the deployed path - bf16 GEMM
  // activations and attention products, a compact KV cache - judged against
  // the exact path by the gate's stage 2.
  // "exact": the gate's fp32 tier, judged against HF fp32 by stage 1.
  std::string precision;
  // Overrides of the precision's parts ("": the precision's choice):
  // KV cache element type: fp32 | bf16 | q8_0 (int8 + an fp16 scale per 32
  // elements, 1.0625 bytes each; head_dim % 32 == 0).
  std::string kv_cache;
  std::string gemm_precision;     // prefill GEMM activations: fp32 | bf16x2 | bf16
  std::string attn_precision;     // attention products: fp32 | bf16
  std::string quant_activations;  // quantized-weight matmul activations: fp32 | int8
  std::string isa;                // scalar | avx2 | avx512 | amx; "": the CPU's best
};

// Front ends' defaults from the environment: each empty field of `options`
// takes EDGELLM_PRECISION, EDGELLM_KV_CACHE, EDGELLM_GEMM_PRECISION,
// EDGELLM_ATTN_PRECISION, EDGELLM_QUANT_PRECISION or EDGELLM_ISA where set.
// The engine itself reads no environment when it resolves a config.
SessionOptions with_environment_defaults(SessionOptions options);

// The config `options` ask for on this CPU: the precision's parts, overrides
// applied, the tier clamped to what the CPU has. Error names a bad value.
kernels::ExecConfig resolve_exec_config(const SessionOptions& options);
// "fast (avx512: GEMM bf16, attention bf16, KV bf16, quantized activations int8)".
std::string describe_exec_config(const kernels::ExecConfig& cfg);

// Diagnosis capture from prefill: HF-compatible names in the comments.
struct PrefillCapture {
  bool layers = true;       // capture layer_outputs and final_hidden
  bool all_logits = false;  // capture logits for every position
  std::vector<std::vector<float>>
      layer_outputs;                // [layer][n_tokens * hidden]: hidden_states[l + 1]
  std::vector<float> final_hidden;  // [n_tokens * hidden]: after model.norm
  // [n_tokens][vocab], each row computed as a decode step computes its logits
  // (the LM head's GEMV), so a row equals what decoding that position yields.
  std::vector<float> logits;
};

class Context;

// Prefill chunks of at least this many tokens compute each row with the
// prefill kernels, the same whatever the chunk's size and start; shorter ones
// run the decode kernels, which round differently. A prompt prefilled in chunks
// of at least this size, or continued after a prefix's KV was loaded
// (Context::load_kv), gets the same KV and logits bit for bit as one prefill.
inline constexpr int kMinPrefillChunk = 16;

// The next chunk of a prompt with `left` tokens to prefill, under a budget of
// `budget` tokens: at least kMinPrefillChunk tokens and never leaving fewer (a
// shorter rest goes whole), so every row runs the prefill kernels; it passes
// the budget by less than 2 x kMinPrefillChunk.
size_t prefill_chunk_size(size_t left, size_t budget);

// The immutable part, loaded once: config, tokenizer, chat template, packed
// weights, RoPE tables and the thread pool. Any number of Contexts share one
// Model; its forward passes run one at a time (the thread pool takes one
// caller), so Contexts may be used from several threads.
class Model {
 public:
  Model();
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  // ONE-TIME: map and validate config, tokenizer and weights; pre-pack weights
  // for the kernels; build the RoPE tables and threads. options.max_context is
  // the KV cache size of each Context.
  void setup(const std::filesystem::path& model_dir, const SessionOptions& options = {});
  bool ready() const { return state_ != nullptr; }

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const ChatTemplate& chat_template() const;
  Profiler& profiler() const;
  int max_context() const;
  int threads() const;
  size_t weight_bytes() const;  // bytes one decode step streams from the weights
  // "F32" / "F16": the checkpoint's matrices of that dtype held values bf16
  // cannot and were rounded at load (setup says so on stderr); "": held exactly.
  std::string rounded_weights() const;
  std::string kv_cache_dtype() const;              // "fp32" | "bf16" | "q8_0"
  size_t kv_cache_bytes() const;                   // of each Context's KV cache
  const kernels::ExecConfig& exec_config() const;  // resolved at setup

  struct State;  // opaque (session.cpp)

 private:
  std::shared_ptr<State> state_;
  friend class Context;
};

// One sequence: its KV cache, activation scratch, logits and position. It keeps
// the model's weights alive, so it may outlive the Model object it came from.
//
// position() is the one record of how many positions of the sequence are
// valid: [0, position()) hold the KV of the tokens run so far. Every call that
// writes positions [p, p + n) (prefill, decode_step, decode_rows,
// decode_batch, load_kv) sets it to p + n, so what lies past it is discarded;
// rewind() discards positions without running anything. Generator and the
// server's scheduler read it rather than counting positions themselves.
class Context {
 public:
  Context();  // empty: prefill/decode_step throw until assigned a Context(model)
  explicit Context(const Model& model);  // allocates the KV cache
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  bool ready() const { return state_ != nullptr; }

  // Runs `tokens` at positions [start_pos, start_pos + n) and returns the logits
  // of the last one ([vocab]). start_pos > 0 continues a conversation whose
  // earlier positions are already in the KV cache.
  std::span<const float> prefill(std::span<const int32_t> tokens, int start_pos = 0,
                                 PrefillCapture* capture = nullptr);

  // Runs several independent token lists in one prefill, side by side in this
  // cache (each from position 0, attending only to itself), and writes each
  // one's last position after the final norm to hidden ([inputs][hidden_size])
  // and, when `logits` is non-empty, its logits ([inputs][vocab]): the pooling
  // of embedding and reranker models (pooling.h). Their total length must fit
  // the context. The cache then holds no sequence to continue (position() 0).
  void prefill_packed(std::span<const std::span<const int32_t>> inputs, std::span<float> hidden,
                      std::span<float> logits = {});

  // Runs one token at `pos` and returns the logits for the next position.
  std::span<const float> decode_step(int32_t token, int pos);
  // Runs tokens[i] at start_pos + i in one decode batch over this cache:
  // logits [n][vocab], row i bit-identical to decode_step(tokens[i], start_pos
  // + i) after the rows before it (prompt-lookup decoding's draft check).
  void decode_rows(std::span<const int32_t> tokens, int start_pos, std::vector<float>& logits);
  // Keeps positions [0, pos) and discards the rest (0 <= pos <= position()),
  // e.g. the rows of a rejected draft. Their KV is simply overwritten by the
  // next forward: nothing moves.
  void rewind(int pos);

  // The KV cache of positions [start, start + n) as bytes: every layer's keys
  // and values in the cache's element type. load_kv() writes such bytes into
  // any Context of the same model, which then continues at start + n exactly as
  // if it had computed those positions itself (the prefix cache's reuse).
  size_t kv_bytes(int n) const;
  void save_kv(int start, int n, std::span<uint8_t> out) const;
  void load_kv(int start, int n, std::span<const uint8_t> in);

  std::span<const float> logits() const;  // of the last prefill/decode_step
  int position() const;                   // valid positions in the KV cache: next one to run
  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  int max_context() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  friend void decode_batch(std::span<Context* const>, std::span<const int32_t>,
                           std::span<const int>);
};

// One decode step for several Contexts of the same model in one pass over the
// weights: contexts[i] runs tokens[i] at positions[i]. Each context's logits()
// are then bit-identical to its own decode_step(tokens[i], positions[i]).
void decode_batch(std::span<Context* const> contexts, std::span<const int32_t> tokens,
                  std::span<const int> positions);

// A Model with one Context: the seed-shaped programs' setup / prefill /
// decode_step contract.
class Session {
 public:
  Session();
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // ONE-TIME: map and validate config, tokenizer and weights; pre-pack weights
  // for the kernels; allocate the KV cache, RoPE tables and threads. Refuses
  // (Error) a setup whose memory need exceeds what is available, before
  // allocating it. The checkpoint is unmapped when setup returns. Every other
  // member throws Error until a setup has succeeded.
  // `model` is a checkpoint directory, or a .gguf file inside one (its matrices
  // run quantized; see models/gguf_weights.h).
  void setup(const std::filesystem::path& model, const SessionOptions& options = {});

  // Runs `tokens` at positions [start_pos, start_pos + n) and returns the logits
  // of the last one ([vocab]). start_pos > 0 continues a conversation whose
  // earlier positions are already in the KV cache.
  std::span<const float> prefill(std::span<const int32_t> tokens, int start_pos = 0,
                                 PrefillCapture* capture = nullptr);

  // Runs one token at `pos` and returns the logits for the next position.
  std::span<const float> decode_step(int32_t token, int pos);

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const ChatTemplate& chat_template() const;
  Profiler& profiler();
  int max_context() const;
  int threads() const;
  size_t weight_bytes() const;  // bytes one decode step streams from the weights
  std::string kv_cache_dtype() const { return model_.kv_cache_dtype(); }
  std::string rounded_weights() const { return model_.rounded_weights(); }
  const kernels::ExecConfig& exec_config() const { return model_.exec_config(); }
  size_t kv_cache_bytes() const { return model_.kv_cache_bytes(); }

  const Model& model() const { return model_; }
  Context& context() { return context_; }

 private:
  Model model_;
  Context context_;
};

// Picks the next token from logits. The order is llama.cpp's and vLLM's:
// penalties on the raw logits, then greedy when temperature == 0, otherwise
// top-k, softmax at the temperature, top-p, min-p, and a draw with a seeded
// generator (splitmix64: the same seed gives the same tokens on any machine).
struct SamplerOptions {
  float temperature = 0.0f;
  int top_k = 0;       // 0 = off
  float top_p = 1.0f;  // 1 = off
  uint64_t seed = 0;
  // Drops the tokens whose probability (after temperature) is below min_p
  // times the most likely one's; 0 = off.
  float min_p = 0.0f;
  // OpenAI's penalties, on the tokens this sampler picked before (the output
  // so far, not the prompt, as vLLM): logit -= frequency_penalty * count +
  // presence_penalty * (count > 0). 0 = off; negative values favour repeats.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // Picks the next token; it counts for the penalties from then on.
  int32_t sample(std::span<const float> logits);
  // What sample() would draw from now: the kept tokens with their
  // probabilities (summing to 1), in the order sample() walks them (most likely
  // first under top-k or top-p, else by id). Greedy: the one argmax token.
  std::vector<std::pair<int32_t, double>> candidates(std::span<const float> logits);

 private:
  std::span<const float> penalized(std::span<const float> logits);

  SamplerOptions options_;
  uint64_t state_;
  std::vector<int32_t> order_;               // the support: top-k ids or all
  std::vector<double> weight_;               // their unnormalised probabilities
  std::vector<float> adjusted_;              // the logits after the penalties
  std::unordered_map<int32_t, int> counts_;  // picked token -> times
};

// One token's log-probability under the model's own distribution: the
// log-softmax of the raw logits, before penalties and temperature (vLLM's and
// OpenAI's `logprobs`).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};
// The `n` most likely tokens with their log-probabilities, most likely first.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, size_t n);
// The log-probability of `token`.
float token_logprob(std::span<const float> logits, int32_t token);

}  // namespace edgellm
