// The engine's contract: setup once, then prefill and decode_step. The
// inference programs, `make profile`, the chat REPL and the verify adapters all
// call these same functions; there is no second forward pass.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "edgellm/config.h"
#include "edgellm/profile.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

struct SessionOptions {
  int threads = 0;         // <= 0: one per hardware thread; at most 4 per hardware thread
  int max_context = 4096;  // KV cache positions; capped by the model's limit and by memory
  bool profile = false;    // per-kernel timing (costs nothing when off)
};

// Diagnosis capture from prefill: HF-compatible names in the comments.
struct PrefillCapture {
  std::vector<std::vector<float>>
      layer_outputs;                // [layer][n_tokens * hidden]: hidden_states[l + 1]
  std::vector<float> final_hidden;  // [n_tokens * hidden]: after model.norm
};

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
  void setup(const std::filesystem::path& model_dir, const SessionOptions& options = {});

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

 private:
  struct State;
  State& state() const;  // throws Error before a successful setup()
  std::unique_ptr<State> state_;
};

// Picks the next token from logits: greedy when temperature == 0, otherwise
// temperature / top-k / top-p sampling with a seeded generator.
struct SamplerOptions {
  float temperature = 0.0f;
  int top_k = 0;       // 0 = off
  float top_p = 1.0f;  // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  uint64_t state_;
  std::vector<int32_t> order_;
};

}  // namespace edgellm
