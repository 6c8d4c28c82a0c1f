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
#include "edgellm/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace edgellm {

struct LayerWeights {
  std::vector<float> attn_norm;       // [hidden]  input_layernorm
  kernels::PackedMatrix qkv;          // [(heads + 2 kv_heads) * head_dim, hidden], Qwen2's bias
  std::vector<float> q_norm, k_norm;  // [head_dim], qk_norm models only
  std::vector<float> sinks;           // [heads], attention_sinks models only (gpt-oss)
  kernels::PackedMatrix o_proj;       // [hidden, heads * head_dim]
  std::vector<float> post_attn_norm;  // Gemma sandwich norm, after attention
  std::vector<float> ffn_norm;        // [hidden]  norm before the MLP
  kernels::PackedMatrix gate_up;      // [2 * intermediate, hidden]; dense layers
  kernels::PackedMatrix down;         // [hidden, intermediate]; dense layers
  // (A MoE layer's shared MLP in gate_up / down: MoeSpec::shared_intermediate_size wide.)
  kernels::PackedMatrix shared_expert_gate;  // [1, hidden]; MoeSpec::shared_expert_gate
  // MoE layers (LayerSpec::moe): the router and each expert's MLP, gate and up fused.
  kernels::PackedMatrix router;                       // [num_experts, hidden]
  std::vector<kernels::PackedMatrix> expert_gate_up;  // [2 * expert_intermediate, hidden] each
  std::vector<kernels::PackedMatrix> expert_down;     // [hidden, expert_intermediate] each
  std::vector<float> post_ffn_norm;                   // Gemma sandwich norm, after the MLP
};

struct ModelWeights {
  std::vector<uint16_t> embed;        // [vocab, hidden] bf16; empty when tied to lm_head
  kernels::PackedMatrix embed_quant;  // GGUF embedding table (quant set), used first
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  kernels::PackedMatrix lm_head;  // [vocab, hidden] (the embedding when tied)

  size_t decode_bytes = 0;  // weight bytes one decode step reads (MoE: the routed experts')
  // "f32" / "f16": some matrix of that dtype held values that are not bf16 ones,
  // rounded at load (the engine holds matrices in bf16); null: all held exactly.
  const char* rounded_from = nullptr;

  // Token's embedding row as fp32 (unscaled), from `embed` or the tied lm_head.
  void embed_row(size_t token, float* out) const;
};

struct QuantSource;
// Finds every tensor the config needs and checks its shape without reading
// data; returns the bytes load_weights will allocate (matrices from `quant` at
// their repacked size, kernels::repacked_bytes; the others as bf16). Call it
// before sizing anything by the config: it fails on the first tensor the
// checkpoint lacks.
size_t check_weights(const Checkpoint& ckpt, const ModelConfig& config,
                     const QuantSource* quant = nullptr);

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

// Looks up every tensor the config needs (find_layer in weights.cpp), checks
// its shape and values, and packs it. Errors name the tensor, expected and
// actual. The result holds no pointer into the checkpoint's mapping. bf16
// matrices are packed for the kernels of tier `isa`. Layers are packed in
// parallel on `pool` (nullptr: on the calling thread).
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& config,
                          ThreadPool* pool = nullptr, const QuantSource* quant = nullptr,
                          kernels::Isa isa = kernels::active_isa());

}  // namespace edgellm
