// Tier-1 model tests on tiny random checkpoints (no download): the KV-cached
// decode path must reproduce a full prefill, for each family's flags.
#include <gtest/gtest.h>

#include <cmath>

#include "edgellm/config.h"
#include "edgellm/error.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "models/transformer.h"
#include "models/weights.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::FakeTensor;
using testing::random_tensor;

struct TinyModel {
  std::filesystem::path dir;
  ModelConfig config;
};

TinyModel write_tiny(const std::string& architecture, const std::string& extra,
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

std::vector<float> prefill_logits(Transformer& model, const std::vector<int32_t>& tokens,
                                  int vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  model.forward(tokens.data(), tokens.size(), 0, logits.data(), nullptr);
  return logits;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(a[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  EXPECT_LE(max_diff, 1e-4 * std::max(1.0, max_abs)) << what;
}

class DecodeMatchesPrefill : public ::testing::TestWithParam<std::pair<std::string, std::string>> {
};

TEST_P(DecodeMatchesPrefill, AtEveryPosition) {
  const auto& [arch, extra] = GetParam();
  // This checks the KV cache and positions, to 1e-4: keep the prefill GEMM's
  // activations in fp32 like decode's (bf16 ones differ by their rounding,
  // which kernels_test bounds separately).
  const kernels::GemmPrecision saved = kernels::gemm_precision();
  kernels::set_gemm_precision(kernels::GemmPrecision::fp32);
  struct Restore {
    kernels::GemmPrecision p;
    ~Restore() { kernels::set_gemm_precision(p); }
  } restore{saved};
  TinyModel m = write_tiny(arch, extra);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  ThreadPool pool(2);
  Profiler prof;
  Transformer cached(m.config, load_weights(ckpt, m.config), 64, pool, prof);
  Transformer fresh(m.config, load_weights(ckpt, m.config), 64, pool, prof);
  const std::vector<int32_t> tokens = {5, 17, 3,  96, 42, 8,
                                       0, 61, 23, 77, 11};  // longer than the window
  std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
  cached.forward(tokens.data(), 3, 0, logits.data(), nullptr);
  for (size_t pos = 3; pos < tokens.size(); ++pos) {
    cached.forward(&tokens[pos], 1, pos, logits.data(), nullptr);
    const std::vector<int32_t> prefix(tokens.begin(),
                                      tokens.begin() + static_cast<std::ptrdiff_t>(pos + 1));
    expect_close(logits, prefill_logits(fresh, prefix, m.config.vocab_size),
                 arch + " pos " + std::to_string(pos));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, DecodeMatchesPrefill,
    ::testing::Values(std::make_pair("LlamaForCausalLM", ""),
                      std::make_pair("LlamaForCausalLM",
                                     R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})"),
                      std::make_pair("Qwen2ForCausalLM", ""),
                      std::make_pair("Qwen3ForCausalLM", ""),
                      std::make_pair("Gemma3ForCausalLM", "")));

TEST(WeightsTest, MissingTensorIsNamed) {
  TinyModel m = write_tiny("LlamaForCausalLM", "", /*drop_a_tensor=*/true);
  Checkpoint ckpt = Checkpoint::open(m.dir);
  try {
    load_weights(ckpt, m.config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(WeightsTest, ShapeDisagreeingWithConfigIsNamed) {
  TinyModel m = write_tiny("LlamaForCausalLM", "");
  std::string cfg =
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 48, "intermediate_size": 96,
    "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 97})";
  testing::write_text(m.dir / "config.json", cfg);
  const ModelConfig c = load_model_config(m.dir / "config.json");
  Checkpoint ckpt = Checkpoint::open(m.dir);
  try {
    load_weights(ckpt, c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("gate_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[80, 48]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[96, 48]"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace edgellm
