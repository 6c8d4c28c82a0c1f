#include <gtest/gtest.h>

#include "edgellm/config.h"
#include "edgellm/error.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::make_temp_dir;
using testing::write_text;

const char* kLlama =
    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
  "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
  "tie_word_embeddings": true, "eos_token_id": 2, "bos_token_id": 1})";

std::string error_of(const std::string& text) {
  auto dir = make_temp_dir("config");
  write_text(dir / "config.json", text);
  try {
    load_model_config(dir / "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, ParsesLlama) {
  auto dir = make_temp_dir("config");
  write_text(dir / "config.json", kLlama);
  const ModelConfig c = load_model_config(dir / "config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.layers[1].rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.query_scale, 0.25f);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_FALSE(c.qk_norm);
}

TEST(ConfigTest, Gemma3LayersAndScales) {
  const ModelConfig c = [] {
    auto dir = make_temp_dir("config");
    write_text(dir / "config.json", R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 640,
      "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1,
      "head_dim": 256, "vocab_size": 1000, "query_pre_attn_scalar": 256, "sliding_window": 512,
      "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6})");
    return load_model_config(dir / "config.json");
  }();
  EXPECT_TRUE(c.sandwich_norms && c.norm_adds_one && c.qk_norm && c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, Activation::gelu_tanh);
  EXPECT_FLOAT_EQ(c.embedding_scale, 25.25f);  // sqrt(640) = 25.298 rounded to bf16
  EXPECT_EQ(c.layers[0].sliding_window, 512);
  EXPECT_FLOAT_EQ(c.layers[0].rope_theta, 10000.0f);
  EXPECT_EQ(c.layers[5].sliding_window, 0);  // every 6th layer is global
  EXPECT_FLOAT_EQ(c.layers[5].rope_theta, 1e6f);
}

TEST(ConfigTest, RejectsBadInputWithFieldName) {
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures": ["BertModel"], "hidden_size": 8})").find("BertModel"),
            std::string::npos);
  std::string no_hidden = kLlama;
  no_hidden.replace(no_hidden.find("\"hidden_size\": 64"), 17, "\"hidden_size\": -1");
  EXPECT_NE(error_of(no_hidden).find("'hidden_size'"), std::string::npos);
  std::string bad_kv = kLlama;
  bad_kv.replace(bad_kv.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  EXPECT_NE(error_of(bad_kv).find("num_key_value_heads"), std::string::npos);
  std::string bad_scaling = kLlama;
  bad_scaling.insert(1, R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0}, )");
  EXPECT_NE(error_of(bad_scaling).find("yarn"), std::string::npos);
  std::string truncated = kLlama;
  EXPECT_NE(error_of(truncated.substr(0, truncated.size() / 2)).find("config.json"),
            std::string::npos);
  EXPECT_NE(error_of("").find("config.json"), std::string::npos);
}

TEST(ConfigTest, MissingFileSaysSo) {
  EXPECT_THROW(load_model_config("/nonexistent/config.json"), Error);
}

}  // namespace
}  // namespace edgellm
