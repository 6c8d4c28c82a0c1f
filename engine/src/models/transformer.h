// The decoder-only forward pass shared by every supported family (Llama,
// SmolLM2, Qwen2/3, Gemma 3). Family differences are ModelConfig flags.
#pragma once

#include <vector>

#include "edgellm/config.h"
#include "edgellm/profile.h"
#include "edgellm/session.h"
#include "edgellm/thread_pool.h"
#include "models/weights.h"

namespace edgellm {

// cos/sin for every position of one RoPE base, [max_context][head_dim / 2] each.
struct RopeTable {
  float theta = 0.0f;
  bool scaled = false;
  std::vector<float> cos, sin;
};

class Transformer {
 public:
  Transformer(const ModelConfig& config, ModelWeights weights, int max_context, ThreadPool& pool,
              Profiler& profiler);

  // Runs tokens at positions [start, start + n), appends their K/V to the
  // cache and writes the last position's logits to `logits` ([vocab]).
  void forward(const int32_t* tokens, size_t n, size_t start, float* logits,
               PrefillCapture* capture);

  size_t decode_bytes() const { return weights_.decode_bytes; }

 private:
  void ensure_scratch(size_t n);
  void attention_block(size_t layer, size_t n, size_t start);
  void mlp_block(size_t layer, size_t n);

  const ModelConfig& c_;
  ModelWeights weights_;
  size_t max_context_;
  ThreadPool& pool_;
  Profiler& prof_;

  std::vector<RopeTable> rope_tables_;
  std::vector<const RopeTable*> layer_rope_;  // per layer
  std::vector<float> k_cache_, v_cache_;      // [layer][kv_head][max_context][head_dim]

  // Scratch, sized for the largest n seen (decode's n = 1 is allocated in setup).
  size_t scratch_tokens_ = 0;
  std::vector<float> x_, xn_, qkv_, q_, attn_, proj_, gate_up_, act_;
};

}  // namespace edgellm
