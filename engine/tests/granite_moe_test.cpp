// GraniteMoE's switches of the MoE block (models/moe.h): top-k over the router logits then a
// softmax over those k (HF GraniteMoeTopKGating), the shared MLP GraniteMoeShared adds to
// every token (and Qwen2-MoE's, gated by a sigmoid), and the config fields that choose them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "edgellm/bf16.h"
#include "edgellm/config.h"
#include "edgellm/error.h"
#include "models/moe.h"
#include "test_util.h"

namespace edgellm {
namespace {

TEST(GraniteMoeRouting, SoftmaxOverTheTopKLogitsAlone) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};
  std::vector<Route> r(2);
  route_token_topk_softmax(logits.data(), logits.size(), 2, r.data());
  ASSERT_EQ(r[0].expert, 1);
  ASSERT_EQ(r[1].expert, 3);
  // softmax([2, 1]): the other experts' logits take no share (a softmax over all four
  // would give e^2 / (e^.5 + e^2 + e^-1 + e) = 0.61, not 0.73).
  EXPECT_NEAR(r[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(r[1].weight, 1.0 / (1.0 + std::exp(1.0)), 1e-7);
}

TEST(GraniteMoeRouting, TiesGoToTheLowestIndexAndLargeLogitsStayFinite) {
  const std::vector<float> ties = {1.0f, 3.0f, 3.0f, 1.0f, 3.0f};
  std::vector<Route> r(2);
  route_token_topk_softmax(ties.data(), ties.size(), 2, r.data());
  EXPECT_EQ(r[0].expert, 1);
  EXPECT_EQ(r[1].expert, 2);
  EXPECT_EQ(r[0].weight, 0.5f);
  const std::vector<float> large = {1000.0f, 999.0f, -1000.0f};
  route_token_topk_softmax(large.data(), large.size(), 2, r.data());
  EXPECT_NEAR(r[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// A random GraniteMoeShared layer: E experts of width X and a shared MLP of width S over
// hidden H, bf16 weights, and its definition in double (HF's GraniteMoeMoE + shared_mlp).
struct TinyGraniteMoe {
  static constexpr size_t H = 32, E = 6, X = 24, S = 40, K = 3;
  ModelConfig c;
  LayerWeights L;
  std::vector<float> router, shared_gate_up, shared_down, shared_gate;
  std::vector<std::vector<float>> gate_up, down;  // per expert, rows [gate; up]
  std::mt19937 rng{11};

  std::vector<uint16_t> matrix(size_t rows, size_t cols, std::vector<float>& values) {
    std::normal_distribution<float> dist(0.0f, 0.3f);
    std::vector<uint16_t> bits(rows * cols);
    values.resize(rows * cols);
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = float_to_bf16(dist(rng));
      values[i] = bf16_to_float(bits[i]);
    }
    return bits;
  }

  explicit TinyGraniteMoe(bool shared, bool gated = false) {
    c.hidden_size = H;
    c.moe.num_experts = E;
    c.moe.experts_per_token = K;
    c.moe.expert_intermediate_size = X;
    c.moe.routing = MoeSpec::Routing::topk_then_softmax;
    c.moe.shared_intermediate_size = shared ? S : 0;
    c.moe.shared_expert_gate = gated;
    const auto pack = [](const std::vector<uint16_t>& bits, size_t rows, size_t cols) {
      return kernels::pack_matrix(bits.data(), rows, cols, kernels::Isa::scalar);
    };
    L.router = pack(matrix(E, H, router), E, H);
    gate_up.resize(E), down.resize(E);
    for (size_t e = 0; e < E; ++e) {
      L.expert_gate_up.push_back(pack(matrix(2 * X, H, gate_up[e]), 2 * X, H));
      L.expert_down.push_back(pack(matrix(H, X, down[e]), H, X));
    }
    if (shared) {
      L.gate_up = pack(matrix(2 * S, H, shared_gate_up), 2 * S, H);
      L.down = pack(matrix(H, S, shared_down), H, S);
    }
    if (gated) L.shared_expert_gate = pack(matrix(1, H, shared_gate), 1, H);
  }

  // out += weight * down(silu(gate x) * up x), gate = rows [0, width), up = rows [width, 2w).
  static void mlp(const std::vector<float>& gu, const std::vector<float>& d, size_t width,
                  const float* x, double weight, std::vector<double>& out) {
    std::vector<double> act(width);
    for (size_t j = 0; j < width; ++j) {
      double g = 0, u = 0;
      for (size_t i = 0; i < H; ++i) {
        g += static_cast<double>(gu[j * H + i]) * x[i];
        u += static_cast<double>(gu[(width + j) * H + i]) * x[i];
      }
      act[j] = g / (1 + std::exp(-g)) * u;
    }
    for (size_t i = 0; i < H; ++i) {
      double s = 0;
      for (size_t j = 0; j < width; ++j) s += d[i * width + j] * act[j];
      out[i] += weight * s;
    }
  }

  std::vector<double> reference(const float* x) const {
    std::vector<double> logits(E);
    for (size_t e = 0; e < E; ++e)
      for (size_t i = 0; i < H; ++i) logits[e] += static_cast<double>(router[e * H + i]) * x[i];
    std::vector<size_t> order(E);
    for (size_t e = 0; e < E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    double sum = 0;
    for (size_t i = 0; i < K; ++i) sum += std::exp(logits[order[i]]);
    std::vector<double> out(H, 0.0);
    for (size_t i = 0; i < K; ++i)
      mlp(gate_up[order[i]], down[order[i]], X, x, std::exp(logits[order[i]]) / sum, out);
    double gate = 1.0;  // Qwen2-MoE: sigmoid(shared_expert_gate . x)
    if (c.moe.shared_expert_gate) {
      double g = 0;
      for (size_t i = 0; i < H; ++i) g += static_cast<double>(shared_gate[i]) * x[i];
      gate = 1.0 / (1.0 + std::exp(-g));
    }
    if (c.moe.shared_intermediate_size) mlp(shared_gate_up, shared_down, S, x, gate, out);
    return out;
  }
};

void check_block(bool shared, bool gated = false) {
  TinyGraniteMoe m(shared, gated);
  constexpr size_t n = 9, H = TinyGraniteMoe::H;
  std::mt19937 rng(5);
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

TEST(GraniteMoeBlock, TopKSoftmaxRoutingMatchesTheDefinition) {
  check_block(false);
}
TEST(GraniteMoeBlock, SharedMlpAddedToEveryToken) {
  check_block(true);
}
TEST(GraniteMoeBlock, SharedExpertGatedBySigmoid) {  // Qwen2-MoE's
  check_block(true, true);
}

ModelConfig qwen2moe_config(const std::string& extra) {
  std::string text = R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 100, "num_experts": 8)";
  text += extra.empty() ? "}" : ", " + extra + "}";
  auto dir = testing::make_temp_dir("qwen2moe");
  testing::write_text(dir / "config.json", text);
  return load_model_config(dir / "config.json");
}

TEST(Qwen2MoeConfig, GatedSharedExpertAndQkvBias) {
  const ModelConfig c = qwen2moe_config(R"("mlp_only_layers": [1])");
  EXPECT_EQ(c.moe.experts_per_token, 4);  // Qwen2MoeConfig's defaults
  EXPECT_EQ(c.moe.expert_intermediate_size, 1408);
  EXPECT_EQ(c.moe.shared_intermediate_size, 5632);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_EQ(c.moe.routing, MoeSpec::Routing::softmax_then_topk);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.layers[0].moe && !c.layers[1].moe && c.layers[2].moe);
  EXPECT_TRUE(c.attention_bias);  // qkv_bias defaults to true; o_proj has none
  EXPECT_FALSE(c.attention_out_bias);
  EXPECT_EQ(c.head_dim, 16);
  const ModelConfig s = qwen2moe_config(R"("shared_expert_intermediate_size": 56, "qkv_bias": false,
                                           "attention_bias": true)");
  EXPECT_EQ(s.moe.shared_intermediate_size, 56);
  EXPECT_FALSE(s.attention_bias || s.attention_out_bias);  // HF reads qkv_bias, not attention_bias
}

TEST(Qwen2MoeConfig, RefusesWhatItCannotRun) {
  const auto error = [](const std::string& extra) {
    try {
      qwen2moe_config(extra);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(R"("use_sliding_window": true)")
                .find("field 'use_sliding_window' true is not supported for Qwen2MoeForCausalLM"),
            std::string::npos);
  EXPECT_EQ(error(R"("use_sliding_window": false, "sliding_window": 8)"), "");
  EXPECT_NE(error(R"("head_dim": 24)")
                .find("'head_dim' (24) times num_attention_heads (4) must equal hidden_size (64)"),
            std::string::npos);
  EXPECT_NE(error(R"("shared_expert_intermediate_size": 0)")
                .find("shared_expert_intermediate_size' must be a positive integer"),
            std::string::npos);
}

ModelConfig granite_config(const std::string& arch, const std::string& extra) {
  std::string text = R"({"architectures": [")" + arch + R"("], "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 100, "num_local_experts": 8,
    "num_experts_per_tok": 3, "embedding_multiplier": 3.0, "residual_multiplier": 0.4,
    "attention_multiplier": 0.3, "logits_scaling": 2.5)";
  text += extra.empty() ? "}" : ", " + extra + "}";
  auto dir = testing::make_temp_dir("granitemoe");
  testing::write_text(dir / "config.json", text);
  return load_model_config(dir / "config.json");
}
std::string granite_error(const std::string& arch, const std::string& extra) {
  try {
    granite_config(arch, extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GraniteMoeConfig, ExpertsMultipliersAndSharedMlp) {
  const ModelConfig c =
      granite_config("GraniteMoeForCausalLM", R"("shared_intermediate_size": 56)");
  for (const LayerSpec& l : c.layers) EXPECT_TRUE(l.moe);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.experts_per_token, 3);
  EXPECT_EQ(c.moe.expert_intermediate_size, 96);  // intermediate_size
  EXPECT_EQ(c.moe.routing, MoeSpec::Routing::topk_then_softmax);
  EXPECT_TRUE(c.moe.stacked_experts);
  EXPECT_EQ(c.moe.shared_intermediate_size, 0);  // GraniteMoeConfig has no shared MLP
  EXPECT_EQ(c.head_dim, 16);                     // hidden / heads, whatever head_dim says
  EXPECT_FLOAT_EQ(c.embedding_scale, 3.0f);
  EXPECT_FLOAT_EQ(c.residual_scale, 0.4f);
  EXPECT_FLOAT_EQ(c.query_scale, 0.3f);
  EXPECT_FLOAT_EQ(c.logit_divisor, 2.5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  const ModelConfig s =
      granite_config("GraniteMoeSharedForCausalLM", R"("shared_intermediate_size": 56)");
  EXPECT_EQ(s.moe.shared_intermediate_size, 56);
  EXPECT_EQ(granite_config("GraniteMoeSharedForCausalLM", "").moe.shared_intermediate_size, 0);
  // HF's defaults: 8 experts, top-2.
  const ModelConfig d = load_model_config([] {
    auto dir = testing::make_temp_dir("granitemoe_default");
    testing::write_text(dir / "config.json", R"({"architectures": ["GraniteMoeForCausalLM"],
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
      "num_attention_heads": 4, "vocab_size": 100})");
    return dir / "config.json";
  }());
  EXPECT_EQ(d.moe.num_experts, 8);
  EXPECT_EQ(d.moe.experts_per_token, 2);
}

TEST(GraniteMoeConfig, RefusesWhatItCannotRun) {
  const std::string nope =
      granite_error("GraniteMoeForCausalLM", R"("position_embedding_type": "nope")");
  EXPECT_NE(nope.find("field 'position_embedding_type' 'nope' is not supported"), std::string::npos)
      << nope;
  EXPECT_EQ(granite_error("GraniteMoeForCausalLM", R"("position_embedding_type": "rope")"), "");
  EXPECT_NE(granite_error("GraniteMoeForCausalLM", R"("num_experts_per_tok": 9)")
                .find("num_experts_per_tok' (9) must not exceed num_local_experts (8)"),
            std::string::npos);
  EXPECT_NE(granite_error("GraniteMoeForCausalLM", R"("num_local_experts": 0)")
                .find("num_local_experts' must be a positive integer"),
            std::string::npos);
  EXPECT_NE(granite_error("GraniteMoeSharedForCausalLM", R"("shared_intermediate_size": -1)")
                .find("shared_intermediate_size' must be a non-negative integer"),
            std::string::npos);
  EXPECT_NE(granite_error("GraniteMoeForCausalLM", R"("num_attention_heads": 5)")
                .find("num_attention_heads' (5) must divide hidden_size (64)"),
            std::string::npos);
}

}  // namespace
}  // namespace edgellm
