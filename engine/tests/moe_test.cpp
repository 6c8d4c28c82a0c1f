// The mixture-of-experts block (models/moe.h): routing as transformers computes it, the
// grouped (one matmul per expert) path against a per-token reference, and the config fields
// that choose MoE layers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "edgellm/bf16.h"
#include "edgellm/config.h"
#include "edgellm/error.h"
#include "gguf_writer.h"
#include "models/gguf_config.h"
#include "models/gguf_weights.h"
#include "models/moe.h"
#include "test_util.h"

namespace edgellm {
namespace {

std::vector<Route> routes_of(const std::vector<float>& logits, size_t k, bool renormalize) {
  std::vector<Route> r(k);
  route_token(logits.data(), logits.size(), k, renormalize, r.data());
  return r;
}

TEST(MoeRouting, SoftmaxThenTopKLargestFirst) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  double sum = 0;
  for (float l : logits) sum += std::exp(l);
  const auto r = routes_of(logits, 2, false);
  ASSERT_EQ(r[0].expert, 1);
  ASSERT_EQ(r[1].expert, 3);
  // Not renormalised: the softmax probabilities over all four experts.
  EXPECT_NEAR(r[0].weight, std::exp(2.0) / sum, 1e-7);
  EXPECT_NEAR(r[1].weight, std::exp(1.0) / sum, 1e-7);
}

TEST(MoeRouting, RenormalisedWeightsSumToOne) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  const auto r = routes_of(logits, 2, true);
  EXPECT_NEAR(r[0].weight, std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-7);
  EXPECT_NEAR(r[1].weight, std::exp(1.0) / (std::exp(2.0) + std::exp(1.0)), 1e-7);
  const auto all = routes_of(logits, 4, true);
  EXPECT_EQ(all[3].expert, 2);  // every expert, smallest last
}

TEST(MoeRouting, TiesGoToTheLowestIndex) {
  // torch.topk leaves the order of equal values unspecified; ours is deterministic.
  const auto r = routes_of({1.0f, 3.0f, 3.0f, 1.0f, 3.0f}, 2, false);
  EXPECT_EQ(r[0].expert, 1);
  EXPECT_EQ(r[1].expert, 2);
}

TEST(MoeRouting, LargeLogitsStayFinite) {  // the max is subtracted before exp
  const auto r = routes_of({1000.0f, 999.0f, -1000.0f}, 2, false);
  EXPECT_EQ(r[0].expert, 0);
  EXPECT_NEAR(r[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// A random MoE layer: E experts of width X over hidden H, bf16 weights.
struct TinyMoe {
  static constexpr size_t H = 32, E = 6, X = 24, K = 2;
  ModelConfig c;
  LayerWeights L;
  std::vector<std::vector<float>> gate, up, down;  // per expert, fp32 of the bf16 values
  std::vector<float> router;

  explicit TinyMoe(bool renormalize) {
    c.hidden_size = H;
    c.moe = {static_cast<int>(E), static_cast<int>(K), static_cast<int>(X), renormalize};
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.3f);
    const auto matrix = [&](size_t rows, size_t cols, std::vector<float>& values) {
      std::vector<uint16_t> bits(rows * cols);
      values.resize(rows * cols);
      for (size_t i = 0; i < bits.size(); ++i) {
        bits[i] = float_to_bf16(dist(rng));
        values[i] = bf16_to_float(bits[i]);
      }
      return bits;
    };
    L.router = kernels::pack_matrix(matrix(E, H, router).data(), E, H, kernels::Isa::scalar);
    gate.resize(E), up.resize(E), down.resize(E);
    for (size_t e = 0; e < E; ++e) {
      std::vector<uint16_t> gu = matrix(X, H, gate[e]), u = matrix(X, H, up[e]);
      gu.insert(gu.end(), u.begin(), u.end());
      L.expert_gate_up.push_back(kernels::pack_matrix(gu.data(), 2 * X, H, kernels::Isa::scalar));
      L.expert_down.push_back(
          kernels::pack_matrix(matrix(H, X, down[e]).data(), H, X, kernels::Isa::scalar));
    }
  }

  // One token by definition, in double: the reference the block must match.
  std::vector<double> reference(const float* x) const {
    std::vector<float> logits(E);
    for (size_t e = 0; e < E; ++e) {
      double s = 0;
      for (size_t i = 0; i < H; ++i) s += static_cast<double>(router[e * H + i]) * x[i];
      logits[e] = static_cast<float>(s);
    }
    std::vector<Route> routes(K);
    route_token(logits.data(), E, K, c.moe.norm_topk_prob, routes.data());
    std::vector<double> out(H, 0.0);
    for (const Route& r : routes) {
      std::vector<double> act(X);
      for (size_t j = 0; j < X; ++j) {
        double g = 0, u = 0;
        for (size_t i = 0; i < H; ++i) {
          g += static_cast<double>(gate[r.expert][j * H + i]) * x[i];
          u += static_cast<double>(up[r.expert][j * H + i]) * x[i];
        }
        act[j] = g / (1 + std::exp(-g)) * u;
      }
      for (size_t i = 0; i < H; ++i) {
        double d = 0;
        for (size_t j = 0; j < X; ++j) d += down[r.expert][i * X + j] * act[j];
        out[i] += r.weight * d;
      }
    }
    return out;
  }
};

void check_block(bool renormalize) {
  TinyMoe m(renormalize);
  constexpr size_t n = 9, H = TinyMoe::H;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n * H);
  for (float& v : x) v = dist(rng);
  ThreadPool pool(2);
  Profiler prof;
  kernels::ExecConfig cfg;  // scalar, fp32: the exact path
  MoeScratch s;
  std::vector<float> grouped(n * H), one(H);
  moe_feed_forward(m.L, m.c, x.data(), n, grouped.data(), s, pool, cfg, kernels::Batch::sequence,
                   prof);
  for (size_t t = 0; t < n; ++t) {
    const std::vector<double> want = m.reference(&x[t * H]);
    moe_feed_forward(m.L, m.c, &x[t * H], 1, one.data(), s, pool, cfg, kernels::Batch::sequence,
                     prof);
    for (size_t i = 0; i < H; ++i) {
      EXPECT_NEAR(grouped[t * H + i], want[i], 1e-4 * (1 + std::abs(want[i]))) << t << " " << i;
      EXPECT_NEAR(one[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << t << " " << i;
    }
  }
}

TEST(MoeBlock, GroupedPrefillAndPerTokenMatchTheDefinition) {
  check_block(true);
}
TEST(MoeBlock, WithoutRenormalisation) {
  check_block(false);
}

ModelConfig moe_config(const std::string& arch, const std::string& extra) {
  std::string text = R"({"architectures": [")" + arch + R"("], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
    "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2)";
  text += extra.empty() ? "}" : ", " + extra + "}";
  auto dir = testing::make_temp_dir("moe");
  testing::write_text(dir / "config.json", text);
  return load_model_config(dir / "config.json");
}
std::vector<bool> moe_layers(const ModelConfig& c) {
  std::vector<bool> v;
  for (const LayerSpec& l : c.layers) v.push_back(l.moe);
  return v;
}
std::string moe_error(const std::string& arch, const std::string& extra) {
  try {
    moe_config(arch, extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeConfig, WhichLayersAreMoe) {
  const ModelConfig q = moe_config("Qwen3MoeForCausalLM", R"("moe_intermediate_size": 40)");
  EXPECT_EQ(moe_layers(q), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(q.moe.expert_intermediate_size, 40);
  EXPECT_FALSE(q.moe.norm_topk_prob);  // Qwen3MoeConfig's default
  EXPECT_TRUE(q.qk_norm && !q.qk_norm_whole);
  EXPECT_EQ(moe_layers(moe_config("Qwen3MoeForCausalLM",
                                  R"("decoder_sparse_step": 2, "mlp_only_layers": [3])")),
            (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(moe_layers(moe_config("Qwen3MoeForCausalLM", R"("num_experts": 0)")),
            (std::vector<bool>{false, false, false, false}));
  // Qwen3-MoE windows every layer, and only with use_sliding_window.
  EXPECT_EQ(moe_config("Qwen3MoeForCausalLM", R"("sliding_window": 7)").layers[3].sliding_window,
            0);
  for (const LayerSpec& l :
       moe_config("Qwen3MoeForCausalLM", R"("use_sliding_window": true, "sliding_window": 7)")
           .layers)
    EXPECT_EQ(l.sliding_window, 7);
  const ModelConfig o = moe_config("OlmoeForCausalLM", R"("head_dim": 7, "norm_topk_prob": true)");
  EXPECT_EQ(moe_layers(o), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(o.moe.expert_intermediate_size, 96);  // OLMoE's experts: intermediate_size
  EXPECT_EQ(o.head_dim, 16);                      // hidden / heads, whatever head_dim says
  EXPECT_TRUE(o.moe.norm_topk_prob && o.qk_norm_whole && o.qk_norm);
}

TEST(MoeConfig, RefusesWhatItCannotRun) {
  EXPECT_NE(
      moe_error("Qwen3MoeForCausalLM", R"("num_experts_per_tok": 9)").find("num_experts_per_tok"),
      std::string::npos);
  EXPECT_NE(moe_error("Qwen3MoeForCausalLM", R"("mlp_only_layers": [4])").find("mlp_only_layers"),
            std::string::npos);
  EXPECT_NE(moe_error("Qwen3MoeForCausalLM", R"("mlp_only_layers": 1)")
                .find("mlp_only_layers' must list layer indices"),
            std::string::npos);
  EXPECT_NE(moe_error("OlmoeForCausalLM", R"("clip_qkv": 8.0)").find("clip_qkv"),
            std::string::npos);
  EXPECT_EQ(moe_error("OlmoeForCausalLM", R"("clip_qkv": null)"), "");
}

// A qwen3moe GGUF's metadata, and router tensors on layers 0 and 2 only.
testing::GgufWriter qwen3moe_gguf(uint32_t used) {
  testing::GgufWriter w;
  const std::string a = "qwen3moe.";
  w.kv_str("general.architecture", "qwen3moe");
  w.kv_u32(a + "context_length", 512);
  w.kv_u32(a + "embedding_length", 64);
  w.kv_u32(a + "block_count", 3);
  w.kv_u32(a + "feed_forward_length", 96);
  w.kv_u32(a + "attention.head_count", 4);
  w.kv_u32(a + "attention.head_count_kv", 2);
  w.kv_u32(a + "attention.key_length", 24);
  w.kv_u32(a + "attention.value_length", 24);
  w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_u32(a + "expert_count", 8);
  w.kv_u32(a + "expert_used_count", used);
  w.kv_u32(a + "expert_feed_forward_length", 40);
  w.tensor("token_embd.weight", 0, {64, 10}, std::vector<uint8_t>(64 * 10 * 4));
  for (const char* router : {"blk.0.ffn_gate_inp.weight", "blk.2.ffn_gate_inp.weight"})
    w.tensor(router, 0, {64, 8}, std::vector<uint8_t>(64 * 8 * 4));
  return w;
}
std::filesystem::path write_gguf(const testing::GgufWriter& w) {
  const auto bytes = w.bytes();
  const auto p = testing::make_temp_dir("moe_gguf") / "m.gguf";
  testing::write_text(p, std::string(bytes.begin(), bytes.end()));
  return p;
}
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MoeGguf, Qwen3MoeMetadata) {
  const ModelConfig c = model_config_from_gguf(GgufFile::open(write_gguf(qwen3moe_gguf(2))));
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.experts_per_token, 2);
  EXPECT_EQ(c.moe.expert_intermediate_size, 40);
  EXPECT_TRUE(c.moe.norm_topk_prob);  // llama.cpp renormalises qwen3moe's top-k
  EXPECT_EQ(moe_layers(c), (std::vector<bool>{true, false, true}));  // where a router is
  testing::GgufWriter plain = qwen3moe_gguf(2);
  plain.kv_bool("qwen3moe.expert_weights_norm", false);
  EXPECT_FALSE(model_config_from_gguf(GgufFile::open(write_gguf(plain))).moe.norm_topk_prob);

  const std::string too_many =
      error_of([] { model_config_from_gguf(GgufFile::open(write_gguf(qwen3moe_gguf(9)))); });
  EXPECT_NE(too_many.find("qwen3moe.expert_used_count' must be a positive integer up to 8"),
            std::string::npos)
      << too_many;
}

TEST(MoeGguf, StackedExpertsMustBeThreeDimensional) {
  testing::GgufWriter w = qwen3moe_gguf(2);
  w.tensor("blk.0.ffn_gate_exps.weight", 0, {64, 40}, std::vector<uint8_t>(64 * 40 * 4));
  const std::string e = error_of([&] { open_bare_gguf_weights(write_gguf(w)); });
  EXPECT_NE(e.find("tensor 'blk.0.ffn_gate_exps.weight' must be 3-D [experts][rows][cols]"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace edgellm
