// gpt-oss as configuration (GptOssForCausalLM, GGUF "gpt-oss"): what config.json and GGUF
// metadata switch on, what they refuse by name, and the router's top-k-then-softmax. The
// forward pass against transformers is tests/test_family_fixtures.py's (gptoss-tiny).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "edgellm/config.h"
#include "edgellm/error.h"
#include "gguf_writer.h"
#include "models/gguf_config.h"
#include "models/gguf_weights.h"
#include "models/moe.h"
#include "models/weights.h"
#include "test_util.h"

namespace edgellm {
namespace {

ModelConfig gpt_oss_config(const std::string& extra = "") {
  std::string text = R"({"architectures": ["GptOssForCausalLM"], "hidden_size": 64,
    "intermediate_size": 40, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 100, "num_local_experts": 8,
    "num_experts_per_tok": 3, "max_position_embeddings": 4096, "rope_theta": 150000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": false, "original_max_position_embeddings": 128})";
  text += extra.empty() ? "}" : ", " + extra + "}";
  auto dir = testing::make_temp_dir("gpt_oss");
  testing::write_text(dir / "config.json", text);
  return load_model_config(dir / "config.json");
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

TEST(GptOssConfig, SwitchesOfTheFamily) {
  const ModelConfig c = gpt_oss_config();
  // GptOssConfig's defaults: q/k/v/o biases; layer_types absent, even layers slide (window 128).
  EXPECT_TRUE(c.attention_bias && c.attention_out_bias);
  EXPECT_TRUE(c.attention_sinks);
  for (size_t l = 0; l < c.layers.size(); ++l) {
    EXPECT_TRUE(c.layers[l].moe) << l;
    EXPECT_EQ(c.layers[l].sliding_window, l % 2 == 0 ? 128 : 0) << l;
  }
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.experts_per_token, 3);
  EXPECT_EQ(c.moe.expert_intermediate_size, 40);  // intermediate_size: the experts' width
  EXPECT_TRUE(c.moe.routing == MoeSpec::Routing::topk_then_softmax && c.moe.biases);
  EXPECT_EQ(c.hidden_act, Activation::swiglu_oai);
  const RopeScaling& rs = c.rope_scaling;
  EXPECT_EQ(rs.type, RopeScaling::Type::yarn);
  EXPECT_FALSE(rs.truncate);
  EXPECT_EQ(rs.original_max_position, 128);
  EXPECT_FLOAT_EQ(rs.attention_factor, static_cast<float>(0.1 * std::log(32.0) + 1.0));
  // layer_types decide when given; an explicit attention_factor wins over the inferred one.
  const ModelConfig t = gpt_oss_config(
      R"("sliding_window": 5, "layer_types": ["full_attention", "sliding_attention",
         "sliding_attention", "full_attention"])");
  EXPECT_EQ(t.layers[0].sliding_window, 0);
  EXPECT_EQ(t.layers[1].sliding_window, 5);
  EXPECT_EQ(t.layers[3].sliding_window, 0);
  const ModelConfig f = gpt_oss_config(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "attention_factor": 1.5})");
  EXPECT_FLOAT_EQ(f.rope_scaling.attention_factor, 1.5f);
  EXPECT_TRUE(f.rope_scaling.truncate);                   // HF's default when the key is absent
  EXPECT_EQ(f.rope_scaling.original_max_position, 4096);  // falls back to max_position
}

TEST(GptOssConfig, RefusesWhatItDoesNotImplementByName) {
  const auto refused = [](const std::string& extra, const std::string& field) {
    const std::string e = error_of([&] { gpt_oss_config(extra); });
    EXPECT_NE(e.find("field '" + field + "'"), std::string::npos) << extra << ": " << e;
  };
  refused(R"("swiglu_limit": 6.0)", "swiglu_limit");
  refused(R"("experts_per_token": 4)", "experts_per_token");
  refused(R"("quantization_config": {"quant_method": "mxfp4"})", "quantization_config");
  refused(R"("num_experts_per_tok": 9)", "num_experts_per_tok");
  refused(R"("rope_scaling": {"rope_type": "yarn", "factor": 0.5})", "rope_scaling.factor");
  // What the original checkpoints say is accepted.
  EXPECT_EQ(error_of([] { gpt_oss_config(R"("swiglu_limit": 7.0, "experts_per_token": 3)"); }),
            "(no error)");
}

TEST(GptOssRouting, TopKLogitsThenSoftmax) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f};
  Route r[3];
  route_token_topk_softmax(logits, 5, 3, r);
  // Ties to the lowest index, largest first; softmax over the three chosen logits only.
  EXPECT_EQ(r[0].expert, 1);
  EXPECT_EQ(r[1].expert, 4);
  EXPECT_EQ(r[2].expert, 3);
  const double sum = 2 * std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(r[0].weight, std::exp(2.0) / sum, 1e-7);
  EXPECT_NEAR(r[1].weight, std::exp(2.0) / sum, 1e-7);
  EXPECT_NEAR(r[2].weight, std::exp(1.0) / sum, 1e-7);
  const float huge[] = {1000.0f, -1000.0f, 999.0f};  // the max is subtracted first
  route_token_topk_softmax(huge, 3, 2, r);
  EXPECT_NEAR(r[0].weight, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// One gpt-oss layer as transformers stores it, every element a distinct small integer (exact in
// bf16), so a packed value says which checkpoint element it came from.
struct GptOssCheckpoint {
  ModelConfig c = gpt_oss_config(R"("num_hidden_layers": 1)");
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, TensorView> views;
  size_t bytes = 0;  // what the engine allocates for them: bf16 matrices, fp32 vectors

  void add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float>& v = values[name];
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<float>((i * 7 + name.size()) % 251));
    views[name] = {name, DType::f32, shape, v.data(), v.size() * 4, "test"};
    bytes += static_cast<size_t>(n) * (shape.size() >= 2 ? 2 : 4);
  }
  GptOssCheckpoint() {
    const int64_t H = 64, D = 24, E = 8, X = 40, V = 100;
    const std::string p = "model.layers.0.";
    add("model.embed_tokens.weight", {V, H});
    add("model.norm.weight", {H});
    add("lm_head.weight", {V, H});
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
    for (const auto& [proj, rows] : {std::pair{"q", 4 * D}, {"k", 2 * D}, {"v", 2 * D}}) {
      add(p + "self_attn." + proj + "_proj.weight", {rows, H});
      add(p + "self_attn." + proj + "_proj.bias", {rows});
    }
    add(p + "self_attn.o_proj.weight", {H, 4 * D});
    add(p + "self_attn.o_proj.bias", {H});
    add(p + "self_attn.sinks", {4});
    add(p + "mlp.router.weight", {E, H});
    add(p + "mlp.router.bias", {E});
    add(p + "mlp.experts.gate_up_proj", {E, H, 2 * X});
    add(p + "mlp.experts.gate_up_proj_bias", {E, 2 * X});
    add(p + "mlp.experts.down_proj", {E, X, H});
    add(p + "mlp.experts.down_proj_bias", {E, H});
  }
};

// HF's x @ W experts with gate and up interleaved become the engine's W[out][in] rows, [gate; up]
// de-interleaved, each bias in its row's order; the plan counts the stacked tensors as the bf16
// matrices they become.
TEST(GptOssWeights, StackedExpertsUnpackPerExpert) {
  GptOssCheckpoint ck;
  const Checkpoint checkpoint = Checkpoint::from_views(ck.views);
  EXPECT_EQ(check_weights(checkpoint, ck.c), ck.bytes);
  // Setup drops a packed tensor's pages (TensorView::release_pages), which zeroes heap ones.
  auto values = ck.values;
  const ModelWeights w = load_weights(checkpoint, ck.c, nullptr, nullptr, kernels::Isa::scalar);
  const LayerWeights& L = w.layers[0];
  const size_t H = 64, E = 8, X = 40;
  const std::string p = "model.layers.0.mlp.";
  const auto& gate_up = values[p + "experts.gate_up_proj"];
  const auto& gate_up_bias = values[p + "experts.gate_up_proj_bias"];
  const auto& down = values[p + "experts.down_proj"];
  const auto& down_bias = values[p + "experts.down_proj_bias"];
  ASSERT_EQ(L.expert_gate_up.size(), E);
  std::vector<float> row(H);
  for (size_t e = 0; e < E; ++e) {
    const kernels::PackedMatrix& m = L.expert_gate_up[e];
    ASSERT_EQ(m.rows, 2 * X);
    for (size_t r = 0; r < 2 * X; ++r) {
      const size_t col = r < X ? 2 * r : 2 * (r - X) + 1;  // gate: even columns, up: odd
      kernels::unpack_row(m, r, row.data());
      for (size_t c = 0; c < H; ++c)
        ASSERT_EQ(row[c], gate_up[(e * H + c) * 2 * X + col]) << e << " " << r << " " << c;
      ASSERT_EQ(m.bias.get()[r], gate_up_bias[e * 2 * X + col]) << e << " " << r;
    }
    const kernels::PackedMatrix& d = L.expert_down[e];
    ASSERT_EQ(d.rows, H);
    std::vector<float> drow(X);
    for (size_t h = 0; h < H; ++h) {
      kernels::unpack_row(d, h, drow.data());
      for (size_t x = 0; x < X; ++x) ASSERT_EQ(drow[x], down[(e * X + x) * H + h]) << e;
      ASSERT_EQ(d.bias.get()[h], down_bias[e * H + h]) << e;
    }
  }
  for (size_t e = 0; e < E; ++e) EXPECT_EQ(L.router.bias.get()[e], values[p + "router.bias"][e]);
  EXPECT_EQ(L.sinks, values["model.layers.0.self_attn.sinks"]);
}

// A gpt-oss GGUF's metadata as llama.cpp's converter writes it (tensors: only the embedding).
testing::GgufWriter gpt_oss_gguf() {
  testing::GgufWriter w;
  const std::string a = "gpt-oss.";
  w.kv_str("general.architecture", "gpt-oss");
  w.kv_u32(a + "context_length", 4096);
  w.kv_u32(a + "embedding_length", 64);
  w.kv_u32(a + "block_count", 3);
  w.kv_u32(a + "feed_forward_length", 40);
  w.kv_u32(a + "attention.head_count", 4);
  w.kv_u32(a + "attention.head_count_kv", 2);
  w.kv_u32(a + "attention.key_length", 24);
  w.kv_u32(a + "attention.value_length", 24);
  w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_u32(a + "attention.sliding_window", 6);
  w.kv_u32(a + "expert_count", 8);
  w.kv_u32(a + "expert_used_count", 3);
  w.kv_u32(a + "expert_feed_forward_length", 40);
  w.kv_str(a + "rope.scaling.type", "yarn");
  w.kv_f32(a + "rope.scaling.factor", 4.0f);
  w.kv_u32(a + "rope.scaling.original_context_length", 1024);
  w.tensor("token_embd.weight", 0, {64, 10}, std::vector<uint8_t>(64 * 10 * 4));
  return w;
}
std::filesystem::path write_gguf(const testing::GgufWriter& w) {
  const auto bytes = w.bytes();
  const auto p = testing::make_temp_dir("gpt_oss_gguf") / "m.gguf";
  testing::write_text(p, std::string(bytes.begin(), bytes.end()));
  return p;
}

TEST(GptOssGguf, Metadata) {
  const ModelConfig c = model_config_from_gguf(GgufFile::open(write_gguf(gpt_oss_gguf())));
  EXPECT_EQ(c.architecture, "GptOssForCausalLM");
  EXPECT_TRUE(c.attention_sinks && c.moe.routing == MoeSpec::Routing::topk_then_softmax &&
              c.moe.biases);
  EXPECT_EQ(c.hidden_act, Activation::swiglu_oai);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.experts_per_token, 3);
  // llama.cpp's set_swa_pattern(2): the even layers slide.
  for (size_t l = 0; l < c.layers.size(); ++l) {
    EXPECT_TRUE(c.layers[l].moe);
    EXPECT_EQ(c.layers[l].sliding_window, l % 2 == 0 ? 6 : 0) << l;
  }
  const RopeScaling& rs = c.rope_scaling;
  EXPECT_EQ(rs.type, RopeScaling::Type::yarn);
  EXPECT_EQ(rs.original_max_position, 1024);
  EXPECT_FALSE(rs.truncate);
  EXPECT_FLOAT_EQ(rs.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(rs.attention_factor, static_cast<float>(0.1 * std::log(4.0) + 1.0));
}

TEST(GptOssGguf, RefusesWhatItCannotRead) {
  testing::GgufWriter attn = gpt_oss_gguf();
  attn.kv_f32("gpt-oss.rope.scaling.yarn_attn_factor", 1.2f);
  std::string e = error_of([&] { model_config_from_gguf(GgufFile::open(write_gguf(attn))); });
  EXPECT_NE(e.find("metadata 'gpt-oss.rope.scaling.yarn_attn_factor' is not supported"),
            std::string::npos)
      << e;
  testing::GgufWriter bias = gpt_oss_gguf();
  bias.tensor("blk.0.ffn_gate_exps.bias", 0, {40}, std::vector<uint8_t>(40 * 4));
  e = error_of([&] { open_bare_gguf_weights(write_gguf(bias)); });
  EXPECT_NE(e.find("tensor 'blk.0.ffn_gate_exps.bias' must be 2-D [experts][rows]"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace edgellm
