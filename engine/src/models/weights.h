// The model's weights in the form the kernels want: matrices pre-packed once at
// setup (q/k/v fused into one matrix, gate/up into another, so decode issues
// fewer ops), norm weights as fp32 with Gemma's (1 + w) folded in.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "edgellm/config.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace edgellm {

struct LayerWeights {
  std::vector<float> attn_norm;       // [hidden]  input_layernorm
  kernels::PackedMatrix qkv;          // [(heads + 2 kv_heads) * head_dim, hidden]
  std::vector<float> qkv_bias;        // Qwen2 only
  std::vector<float> q_norm, k_norm;  // [head_dim], qk_norm models only
  kernels::PackedMatrix o_proj;       // [hidden, heads * head_dim]
  std::vector<float> post_attn_norm;  // Gemma sandwich norm, after attention
  std::vector<float> ffn_norm;        // [hidden]  norm before the MLP
  kernels::PackedMatrix gate_up;      // [2 * intermediate, hidden]
  kernels::PackedMatrix down;         // [hidden, intermediate]
  std::vector<float> post_ffn_norm;   // Gemma sandwich norm, after the MLP
};

struct ModelWeights {
  const uint16_t* embed = nullptr;    // [vocab, hidden] bf16 rows, for lookup
  std::vector<uint16_t> embed_owned;  // when the checkpoint is not bf16
  kernels::PackedMatrix embed_quant;  // GGUF embedding, used when embed is null
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  kernels::PackedMatrix lm_head;  // [vocab, hidden] (the embedding when tied)

  size_t decode_bytes = 0;  // weight bytes one decode step reads
};

// Where the 2-D matrices come from when they are not the checkpoint's bf16:
// a GGUF file's blocks, kept exact (models/gguf_weights.h), or the bf16
// weights quantized at setup. Norms always come from the checkpoint.
struct GgufMatrix {
  kernels::BlockFormat format;
  const uint8_t* blocks = nullptr;  // inside the mapped GGUF
  size_t nbytes = 0;
  size_t rows = 0, cols = 0;
  std::vector<int32_t> row_order;  // empty: identity
};
struct QuantSource {
  std::map<std::string, GgufMatrix> gguf;        // HF tensor name -> GGUF blocks
  std::optional<kernels::BlockFormat> quantize;  // q8_0 / q4_0 at setup
};

// Looks up every tensor the config needs (table in weights.cpp), checks its
// shape and dtype, and packs it. Errors name the tensor, expected and actual.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& config, int threads = 1,
                          const QuantSource* quant = nullptr);

}  // namespace edgellm
