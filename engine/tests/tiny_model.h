// Tiny random checkpoints (no download) for the model, session and
// generation tests: 3 layers, hidden 48, the families' flags via `extra`
// config.json keys.
#pragma once

#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "edgellm/config.h"
#include "edgellm/session.h"
#include "test_util.h"

namespace edgellm::testing {

struct TinyModel {
  std::filesystem::path dir;
  ModelConfig config;
};

inline TinyModel write_tiny(const std::string& architecture, const std::string& extra,
                            bool drop_a_tensor = false) {
  TinyModel m;
  m.dir = testing::make_temp_dir("tiny");
  const bool gemma = architecture == "Gemma3ForCausalLM";
  testing::write_text(m.dir / "config.json", R"({"architectures": [")" + architecture + R"("],
    "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 6,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4, "sliding_window_pattern": 3)" +
                                                 extra + "}");
  m.config = load_model_config(m.dir / "config.json");
  const ModelConfig& c = m.config;
  std::mt19937 rng(7);
  std::map<std::string, FakeTensor> t;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  t["model.embed_tokens.weight"] = random_tensor({c.vocab_size, H}, 1.0f, rng);
  t["model.norm.weight"] = random_tensor({H}, 0.2f, rng);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = random_tensor({H}, 1.0f, rng);
    t[p + "post_attention_layernorm.weight"] = random_tensor({H}, 1.0f, rng);
    t[p + "self_attn.q_proj.weight"] = random_tensor({c.num_heads * D, H}, 0.2f, rng);
    t[p + "self_attn.k_proj.weight"] = random_tensor({c.num_kv_heads * D, H}, 0.2f, rng);
    t[p + "self_attn.v_proj.weight"] = random_tensor({c.num_kv_heads * D, H}, 0.2f, rng);
    t[p + "self_attn.o_proj.weight"] = random_tensor({H, c.num_heads * D}, 0.2f, rng);
    t[p + "mlp.gate_proj.weight"] = random_tensor({I, H}, 0.2f, rng);
    t[p + "mlp.up_proj.weight"] = random_tensor({I, H}, 0.2f, rng);
    t[p + "mlp.down_proj.weight"] = random_tensor({H, I}, 0.2f, rng);
    if (c.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = random_tensor({c.num_heads * D}, 0.2f, rng);
      t[p + "self_attn.k_proj.bias"] = random_tensor({c.num_kv_heads * D}, 0.2f, rng);
      t[p + "self_attn.v_proj.bias"] = random_tensor({c.num_kv_heads * D}, 0.2f, rng);
    }
    if (c.qk_norm) {
      t[p + "self_attn.q_norm.weight"] = random_tensor({D}, 1.0f, rng);
      t[p + "self_attn.k_norm.weight"] = random_tensor({D}, 1.0f, rng);
    }
    if (gemma) {
      t[p + "pre_feedforward_layernorm.weight"] = random_tensor({H}, 1.0f, rng);
      t[p + "post_feedforward_layernorm.weight"] = random_tensor({H}, 1.0f, rng);
    }
  }
  if (!c.tie_word_embeddings) t["lm_head.weight"] = random_tensor({c.vocab_size, H}, 0.2f, rng);
  if (drop_a_tensor) t.erase("model.layers.1.mlp.up_proj.weight");
  testing::write_safetensors(m.dir / "model.safetensors", t);
  return m;
}

// A tiny checkpoint a Session can set up (it also needs a tokenizer).
inline TinyModel write_tiny_session_model(const std::string& extra = "") {
  TinyModel m = write_tiny("LlamaForCausalLM", extra);
  testing::write_text(m.dir / "tokenizer.json", testing::kBpeJson);
  return m;
}

// `m` set up on the fast path with a `kv` cache of `context` positions, on `isa` ("": the
// CPU's best).
inline Model fast_model(const TinyModel& m, const std::string& kv, int context,
                        const std::string& isa = "") {
  SessionOptions o;
  o.isa = isa;
  o.threads = 2;
  o.max_context = context;
  o.precision = "fast";
  o.kv_cache = kv;
  Model model;
  model.setup(m.dir, o);
  return model;
}

}  // namespace edgellm::testing
