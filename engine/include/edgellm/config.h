// The model configuration the engine runs, read from a HuggingFace config.json.
// One forward pass serves every supported family; the differences between
// families are the flags below (gemma.cpp's approach), never per-model code.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace edgellm {

// swiglu_oai (gpt-oss): gate clamped above at ModelConfig::swiglu_limit, up clamped to
// +-swiglu_limit, out = (up + 1) * gate * sigmoid(1.702 gate).
enum class Activation { silu, gelu_tanh, swiglu_oai };

struct RopeScaling {
  enum class Type { none, linear, llama3, longrope, yarn };
  Type type = Type::none;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3 only
  float high_freq_factor = 4.0f;  // llama3 only
  int original_max_position = 8192;
  // longrope (Phi-3): per-frequency divisors and the cos/sin scale. Only short_factor:
  // HF switches to long_factor once a sequence passes original_max_position, which the
  // engine never runs (ModelConfig::position_limit).
  std::vector<float> short_factor;
  float attention_factor = 1.0f;  // longrope and yarn: cos and sin times this
  // yarn (gpt-oss): the ramp between interpolated and extrapolated frequencies, from the
  // dims where beta_fast / beta_slow rotations fit original_max_position; truncate rounds
  // those dims to integers.
  float beta_fast = 32.0f, beta_slow = 1.0f;
  bool truncate = true;
};

// Per-layer attention shape: Gemma 3 interleaves sliding-window layers (local
// RoPE base) with global layers; Llama-family layers are all global.
struct LayerSpec {
  int sliding_window = 0;  // 0 = attend to every earlier position
  float rope_theta = 10000.0f;
  bool rope_scaled = true;  // whether rope_scaling applies to this layer
  bool rope = true;         // false: a NoPE layer (SmolLM3's every 4th), positions unrotated
  bool moe = false;         // the feed-forward is ModelConfig::moe's experts, not the dense MLP
};

// A mixture-of-experts feed-forward (Qwen3-MoE, OLMoE, GraniteMoE): a [num_experts, hidden]
// router, the top experts_per_token experts of each token and the weighted sum of their
// SwiGLU MLPs. Qwen3-MoE / OLMoE weigh them by a softmax over every expert in fp32, optionally
// renormalised to sum to 1; GraniteMoE and gpt-oss by a softmax over the k selected logits alone.
struct MoeSpec {
  enum class Routing { softmax_then_topk, topk_then_softmax };
  int num_experts = 0;  // 0: no MoE layer
  int experts_per_token = 0;
  int expert_intermediate_size = 0;  // each expert's MLP width (moe_intermediate_size)
  bool norm_topk_prob = false;       // renormalise the top-k weights (softmax_then_topk)
  Routing routing = Routing::softmax_then_topk;
  // gpt-oss: the router and each expert's projections carry biases (mlp.router,
  // mlp.experts.{gate_up,down}_proj_bias).
  bool biases = false;
  // GraniteMoeShared, Qwen2-MoE: a dense SwiGLU MLP this wide that every token runs, its
  // output added to the experts' sum (the MoE layer's LayerWeights::gate_up / down); 0 = none.
  int shared_intermediate_size = 0;
  // Qwen2-MoE: the shared MLP's output times sigmoid(shared_expert_gate . x), per token.
  bool shared_expert_gate = false;
  // Checkpoint layout: GraniteMoE stacks the experts as block_sparse_moe.input_linear
  // [E, 2 * I, H] (rows [gate; up]) and output_linear [E, H, I]; otherwise one
  // mlp.experts.N.{gate,up,down}_proj per expert (the GGUF loader's names too).
  bool stacked_experts = false;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  int rotary_dim = 0;  // Phi-3's partial rotary: RoPE on these first dims of a head; 0 = all
  float rms_norm_eps = 1e-6f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  Activation hidden_act = Activation::silu;

  bool attention_bias = false;       // Qwen2: q/k/v projections carry a bias
  bool attention_out_bias = false;   // Llama / Granite attention_bias: o_proj has one too
  bool qk_norm = false;              // Qwen3, Gemma 3: RMSNorm over each head of q and k
  bool qk_norm_whole = false;        // OLMo 2, OLMoE: ... over the whole q and k projections
  bool sandwich_norms = false;       // Gemma 3, OLMo 2: norms after attention and after the MLP
  bool pre_norms = true;             // false (OLMo 2): no norm before attention and the MLP
  bool fused_projections = false;    // Phi-3: checkpoint stores qkv_proj and gate_up_proj fused
  bool norm_adds_one = false;        // Gemma: RMSNorm applies (1 + w); folded in at load time
  float embedding_scale = 1.0f;      // Gemma: sqrt(hidden), rounded to bf16 as HF does
  float query_scale = 0.0f;          // multiplies q·k; 1/sqrt(head_dim) unless configured
  float final_logit_softcap = 0.0f;  // 0 = off
  float attn_logit_softcap = 0.0f;   // 0 = off
  float residual_scale = 1.0f;       // Granite: each block's output times residual_multiplier
  float logit_divisor = 1.0f;        // Granite: logits / logits_scaling
  bool attention_sinks = false;      // gpt-oss: a learned logit per head joins each softmax
  float swiglu_limit = 7.0f;         // Activation::swiglu_oai's clamp

  MoeSpec moe;  // the experts of the layers whose LayerSpec::moe is set

  std::vector<LayerSpec> layers;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // The positions the engine runs: max_position_embeddings, or for LongRoPE the original
  // context, the only one in which HF keeps short_factor (the engine's static table).
  int position_limit() const {
    return rope_scaling.type == RopeScaling::Type::longrope
               ? std::min(max_position_embeddings, rope_scaling.original_max_position)
               : max_position_embeddings;
  }

  int rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }

  bool is_eos(int token) const {
    for (int id : eos_token_ids)
      if (id == token) return true;
    return false;
  }
};

// What the architecture implies, wherever the config came from (config.json or
// GGUF metadata): Qwen2's q/k/v bias, Qwen3 / Gemma QK-norm, Gemma's sandwich
// norms, (1 + w) norms and embedding scale, the default 1/sqrt(head_dim) query
// scale. Needs architecture, head_dim and hidden_size set.
void apply_architecture_switches(ModelConfig& c);

// Parses and validates config.json; throws Error naming the file and field.
ModelConfig load_model_config(const std::filesystem::path& config_json);

}  // namespace edgellm
