// The engine's contract: setup once, then prefill and decode_step. The
// inference programs, `make profile`, the chat REPL and the verify adapters all
// call these same functions; there is no second forward pass.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "edgellm/config.h"
#include "edgellm/profile.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

struct SessionOptions {
  int threads = 0;         // <= 0: one per hardware thread
  int max_context = 4096;  // KV cache positions; capped by the model's limit
  bool profile = false;    // per-kernel timing (costs nothing when off)
  // Matrices as stored (""), or a bf16 checkpoint's matrices quantized at
  // setup: "q8_0" or "q4_0" (kernels/quant.h).
  std::string weights;
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
  // for the kernels; allocate the KV cache, RoPE tables and threads.
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

 private:
  struct State;
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
