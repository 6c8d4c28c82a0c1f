// GGUF metadata and tensor names of the families llama.cpp names phi3, olmo2, olmoe and
// granitemoe (models/gguf_config, models/gguf_weights), on small files written here.
// tests/test_gguf_only.py proves each against its converted fixture, logits bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "edgellm/error.h"
#include "gguf_writer.h"
#include "models/gguf_config.h"
#include "models/gguf_weights.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::GgufWriter;

// make_fixture.py's tiny shape: hidden 64, 3 layers, 4 heads of 24 (2 KV heads).
GgufWriter tiny(const std::string& arch) {
  GgufWriter w;
  w.kv_str("general.architecture", arch);
  w.kv_u32(arch + ".context_length", 512);
  w.kv_u32(arch + ".embedding_length", 64);
  w.kv_u32(arch + ".block_count", 3);
  w.kv_u32(arch + ".feed_forward_length", 96);
  w.kv_u32(arch + ".attention.head_count", 4);
  w.kv_u32(arch + ".attention.head_count_kv", 2);
  w.kv_u32(arch + ".attention.key_length", 24);
  w.kv_u32(arch + ".attention.value_length", 24);
  w.kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.tensor("token_embd.weight", 0, {64, 10}, std::vector<uint8_t>(64 * 10 * 4));
  return w;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Phi-3 with partial rotary (18 of 24 dims: 9 pairs), LongRoPE and a sliding window.
GgufWriter phi3(size_t short_pairs = 9, uint32_t window = 7, uint32_t rotary = 18) {
  GgufWriter w = tiny("phi3");
  w.kv_u32("phi3.rope.dimension_count", rotary);
  w.kv_u32("phi3.rope.scaling.original_context_length", 128);
  w.kv_f32("phi3.rope.scaling.attn_factor", 1.25f);
  w.kv_u32("phi3.attention.sliding_window", window);
  w.tensor("rope_factors_long.weight", 0, {9}, f32_bytes(std::vector<float>(9, 2.0f)));
  std::vector<float> shorts(short_pairs);
  for (size_t i = 0; i < short_pairs; ++i) shorts[i] = 1.0f + 0.5f * static_cast<float>(i);
  w.tensor("rope_factors_short.weight", 0, {short_pairs}, f32_bytes(shorts));
  return w;
}

class GgufFamiliesTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = testing::make_temp_dir("gguf_families");
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const GgufWriter& w) {
    const auto bytes = w.bytes();
    const auto p = dir_ / "m.gguf";
    testing::write_text(p, std::string(bytes.begin(), bytes.end()));
    return p;
  }
  ModelConfig config(const GgufWriter& w) {
    return model_config_from_gguf(GgufFile::open(write(w)));
  }
  template <typename Fn>
  static std::string error_of(Fn&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
};

TEST_F(GgufFamiliesTest, Phi3PartialRotaryLongRopeAndWindow) {
  const ModelConfig c = config(phi3());
  EXPECT_EQ(c.architecture, "Phi3ForCausalLM");
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.rotary_dims(), 18);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::longrope);
  EXPECT_EQ(c.rope_scaling.original_max_position, 128);
  EXPECT_EQ(c.position_limit(), 128);  // the short factors' range
  EXPECT_EQ(c.rope_scaling.short_factor, (std::vector<float>{1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5}));
  EXPECT_FLOAT_EQ(c.rope_scaling.attention_factor, 1.25f);  // the file's, as llama.cpp reads it
  for (const LayerSpec& l : c.layers) EXPECT_EQ(l.sliding_window, 7);
  // Phi-4's converter writes 0: no window.
  for (const LayerSpec& l : config(phi3(9, 0)).layers) EXPECT_EQ(l.sliding_window, 0);
  // The factor tensors are read into the config, not refused as unknown tensors.
  const auto w = open_bare_gguf_weights(write(phi3()));
  EXPECT_EQ(w->checkpoint->find("rope_factors_short.weight"), nullptr);
}

TEST_F(GgufFamiliesTest, Phi3BadRopeIsNamed) {
  const std::string pairs = error_of([&] { config(phi3(8)); });
  EXPECT_NE(pairs.find("tensor 'rope_factors_short.weight' must be F32 with one factor per "
                       "rotary pair (9)"),
            std::string::npos)
      << pairs;
  const std::string e = error_of([&] { config(phi3(9, 7, 17)); });
  EXPECT_NE(e.find("'phi3.rope.dimension_count' must equal the head size 24 or be an even "
                   "number below it"),
            std::string::npos)
      << e;
  GgufWriter llama = tiny("llama");
  llama.kv_u32("llama.rope.dimension_count", 18);
  EXPECT_NE(error_of([&] { config(llama); }).find("partial rotary is not supported"),
            std::string::npos);
}

TEST_F(GgufFamiliesTest, Olmo2NormsAndNames) {
  const ModelConfig c = config(tiny("olmo2"));
  EXPECT_EQ(c.architecture, "Olmo2ForCausalLM");
  EXPECT_TRUE(c.sandwich_norms && !c.pre_norms && c.qk_norm_whole);
  // OLMo 2 has no norm before its MLP: a file holding one is refused by name.
  GgufWriter extra = tiny("olmo2");
  extra.tensor("blk.0.ffn_norm.weight", 0, {64}, std::vector<uint8_t>(64 * 4));
  const std::string e = error_of([&] { open_bare_gguf_weights(write(extra)); });
  EXPECT_NE(e.find("tensor 'blk.0.ffn_norm.weight' is not one edgellm knows for a olmo2 model"),
            std::string::npos)
      << e;
}

TEST_F(GgufFamiliesTest, OlmoeExperts) {
  GgufWriter w = tiny("olmoe");
  w.kv_u32("olmoe.expert_count", 8);
  w.kv_u32("olmoe.expert_used_count", 3);
  w.tensor("blk.1.ffn_gate_inp.weight", 0, {64, 8}, std::vector<uint8_t>(64 * 8 * 4));
  const ModelConfig c = config(w);
  EXPECT_EQ(c.architecture, "OlmoeForCausalLM");
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.experts_per_token, 3);
  EXPECT_EQ(c.moe.expert_intermediate_size, 96);  // no expert_feed_forward_length
  EXPECT_FALSE(c.moe.norm_topk_prob);             // llama.cpp does not renormalise olmoe's
  EXPECT_TRUE(c.qk_norm_whole);
  EXPECT_TRUE(c.layers[1].moe && !c.layers[0].moe);
}

TEST_F(GgufFamiliesTest, Qwen2MoeGatedSharedExpert) {
  GgufWriter w = tiny("qwen2moe");
  w.kv_u32("qwen2moe.expert_count", 8);
  w.kv_u32("qwen2moe.expert_used_count", 2);
  w.kv_u32("qwen2moe.expert_feed_forward_length", 40);
  w.tensor("blk.0.ffn_gate_inp.weight", 0, {64, 8}, std::vector<uint8_t>(64 * 8 * 4));
  const std::string missing = error_of([&] { config(w); });
  EXPECT_NE(missing.find("metadata 'qwen2moe.expert_shared_feed_forward_length' is missing"),
            std::string::npos)
      << missing;
  w.kv_u32("qwen2moe.expert_shared_feed_forward_length", 56);
  const ModelConfig c = config(w);
  EXPECT_EQ(c.architecture, "Qwen2MoeForCausalLM");
  EXPECT_EQ(c.moe.expert_intermediate_size, 40);
  EXPECT_EQ(c.moe.shared_intermediate_size, 56);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_FALSE(c.moe.norm_topk_prob);  // llama.cpp does not renormalise qwen2moe's
}

TEST_F(GgufFamiliesTest, GraniteMoeAndItsSharedMlp) {
  GgufWriter w = tiny("granitemoe");
  w.kv_u32("granitemoe.expert_count", 8);
  w.kv_u32("granitemoe.expert_used_count", 2);
  w.kv_f32("granitemoe.embedding_scale", 2.0f);
  w.kv_f32("granitemoe.residual_scale", 0.6f);
  w.kv_f32("granitemoe.attention.scale", 0.2f);
  w.kv_f32("granitemoe.logit_scale", 3.5f);
  for (int l = 0; l < 3; ++l)
    w.tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight", 0, {64, 8},
             std::vector<uint8_t>(64 * 8 * 4));
  const ModelConfig c = config(w);
  EXPECT_EQ(c.architecture, "GraniteMoeForCausalLM");
  EXPECT_EQ(c.moe.routing, MoeSpec::Routing::topk_then_softmax);
  EXPECT_FALSE(c.moe.stacked_experts);  // llama.cpp's stacked tensors, sliced per expert
  EXPECT_EQ(c.moe.expert_intermediate_size, 96);
  EXPECT_EQ(c.moe.shared_intermediate_size, 0);
  EXPECT_FLOAT_EQ(c.embedding_scale, 2.0f);
  EXPECT_FLOAT_EQ(c.residual_scale, 0.6f);
  EXPECT_FLOAT_EQ(c.query_scale, 0.2f);
  EXPECT_FLOAT_EQ(c.logit_divisor, 3.5f);
  w.kv_u32("granitemoe.expert_shared_feed_forward_length", 56);
  const ModelConfig s = config(w);
  EXPECT_EQ(s.architecture, "GraniteMoeSharedForCausalLM");
  EXPECT_EQ(s.moe.shared_intermediate_size, 56);
}

}  // namespace
}  // namespace edgellm
