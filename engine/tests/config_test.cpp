#include <gtest/gtest.h>

#include <cmath>

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

// kLlama with another architecture and extra fields (a JSON object's tail spliced in).
ModelConfig config_of(const std::string& arch, const std::string& extra) {
  std::string text = kLlama;
  text.replace(text.find("LlamaForCausalLM"), 16, arch);
  text.insert(text.rfind('}'), extra.empty() ? "" : ", " + extra);
  auto dir = make_temp_dir("config");
  write_text(dir / "config.json", text);
  return load_model_config(dir / "config.json");
}

std::vector<int> windows(const ModelConfig& c) {
  std::vector<int> w;
  for (const LayerSpec& l : c.layers) w.push_back(l.sliding_window);
  return w;
}

// Which layers slide, as transformers decides per family (each case checked against HF's
// config classes: MistralConfig's default window is 4096, Qwen2's max_window_layers 28).
TEST(ConfigTest, SlidingWindowsFollowEachFamily) {
  EXPECT_EQ(windows(config_of("MistralForCausalLM", "")), (std::vector<int>{4096, 4096}));
  EXPECT_EQ(windows(config_of("MistralForCausalLM", R"("sliding_window": null)")),
            (std::vector<int>{0, 0}));
  EXPECT_EQ(windows(config_of("MistralForCausalLM", R"("sliding_window": 7)")),
            (std::vector<int>{7, 7}));
  EXPECT_EQ(windows(config_of("Qwen2ForCausalLM", R"("sliding_window": 7)")),
            (std::vector<int>{0, 0}));  // use_sliding_window is false by default
  EXPECT_EQ(windows(config_of("Qwen2ForCausalLM",
                              R"("use_sliding_window": true, "sliding_window": 7,
                                 "max_window_layers": 1)")),
            (std::vector<int>{0, 7}));
  EXPECT_EQ(windows(config_of("Qwen3ForCausalLM",
                              R"("use_sliding_window": true, "sliding_window": 5,
                                 "layer_types": ["sliding_attention", "full_attention"])")),
            (std::vector<int>{5, 0}));
  EXPECT_EQ(windows(config_of("LlamaForCausalLM", R"("sliding_window": 7)")),
            (std::vector<int>{0, 0}));  // HF's Llama has no window
  EXPECT_NE(error_of(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 100, "layer_types": ["sliding_attention", "full_attention"]})")
                .find("use_sliding_window is false"),
            std::string::npos);
}

TEST(ConfigTest, GraniteMultipliersAndOutputBias) {
  const ModelConfig g = config_of("GraniteForCausalLM",
                                  R"("embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                     "attention_multiplier": 0.0078125, "logits_scaling": 8.0,
                                     "attention_bias": true)");
  EXPECT_FLOAT_EQ(g.embedding_scale, 12.0f);
  EXPECT_FLOAT_EQ(g.residual_scale, 0.22f);
  EXPECT_FLOAT_EQ(g.query_scale, 0.0078125f);  // replaces 1/sqrt(head_dim)
  EXPECT_FLOAT_EQ(g.logit_divisor, 8.0f);
  EXPECT_TRUE(g.attention_bias && g.attention_out_bias);
  // Qwen2: q/k/v biases without the field, never o_proj's; Mistral: none, whatever it says.
  const ModelConfig q = config_of("Qwen2ForCausalLM", "");
  EXPECT_TRUE(q.attention_bias && !q.attention_out_bias);
  const ModelConfig m = config_of("MistralForCausalLM", R"("attention_bias": true)");
  EXPECT_FALSE(m.attention_bias || m.attention_out_bias);
}

// The config text of a Phi-3 with kLlama's shape (head_dim 16) and `extra` fields.
std::string phi3_text(const std::string& extra) {
  std::string text = kLlama;
  text.replace(text.find("LlamaForCausalLM"), 16, "Phi3ForCausalLM");
  text.insert(text.rfind('}'), extra.empty() ? "" : ", " + extra);
  return text;
}

const char* kLongRope = R"("partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
    "rope_scaling": {"type": "longrope", "short_factor": [1, 2, 3, 4, 5, 6],
                     "long_factor": [2, 3, 4, 5, 6, 7]})";

TEST(ConfigTest, Phi3PartialRotaryLongRopeAndWindow) {
  const ModelConfig c = config_of("Phi3ForCausalLM", kLongRope);
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.rotary_dims(), 12);  // 16 x 0.75
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::longrope);
  EXPECT_EQ(c.rope_scaling.short_factor, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(c.rope_scaling.original_max_position, 64);
  // factor 256 / 64 = 4: sqrt(1 + ln 4 / ln 64) = sqrt(4 / 3)
  EXPECT_FLOAT_EQ(c.rope_scaling.attention_factor, std::sqrt(4.0f / 3.0f));
  EXPECT_EQ(c.position_limit(), 64);  // HF keeps short_factor only up to the original context
  EXPECT_EQ(windows(c), (std::vector<int>{0, 0}));  // HF's default sliding_window: None
  EXPECT_EQ(windows(config_of("Phi3ForCausalLM", R"("sliding_window": 7)")),
            (std::vector<int>{7, 7}));
  const ModelConfig plain = config_of("Phi3ForCausalLM", R"("attention_bias": true)");
  EXPECT_EQ(plain.rotary_dims(), 16);
  EXPECT_EQ(plain.position_limit(), 256);
  EXPECT_FALSE(plain.attention_bias || plain.attention_out_bias);  // HF gives Phi-3 none
  // Other families keep separate projections and their whole head rotated; a part is refused.
  const ModelConfig llama = config_of("LlamaForCausalLM", R"("partial_rotary_factor": 1.0)");
  EXPECT_FALSE(llama.fused_projections);
  EXPECT_EQ(llama.rotary_dims(), 16);
  std::string part = kLlama;
  part.insert(part.rfind('}'), R"(, "partial_rotary_factor": 0.5)");
  EXPECT_NE(error_of(part).find("partial_rotary_factor"), std::string::npos);
}

TEST(ConfigTest, Phi3RefusesWhatItDoesNotImplement) {
  const auto refused = [](const std::string& extra, const std::string& field) {
    const std::string e = error_of(phi3_text(extra));
    EXPECT_NE(e.find(field), std::string::npos) << extra << " -> " << e;
  };
  refused(R"("partial_rotary_factor": 0.3125)", "partial_rotary_factor");  // 5 dims: odd
  refused(R"("partial_rotary_factor": 0.1)", "partial_rotary_factor");     // 1 dim
  refused(R"("partial_rotary_factor": 1.5)", "partial_rotary_factor");
  refused(R"("rope_scaling": {"type": "dynamic", "factor": 2.0})", "rope_scaling.type");
  refused(R"("partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope",
             "short_factor": [1, 2, 3], "long_factor": [2, 3, 4, 5, 6, 7]})",
          "rope_scaling.short_factor");
  refused(R"("partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope",
             "short_factor": [1, 2, 3, 4, 5, 6]})",
          "rope_scaling.long_factor");
  refused(R"("partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope",
             "short_factor": [1, 2, 3, 4, 5, -6], "long_factor": [2, 3, 4, 5, 6, 7]})",
          "rope_scaling.short_factor");
  refused(R"("sliding_window": 0)", "sliding_window");
}

TEST(ConfigTest, SmolLM3NoPeLayers) {
  std::string layers = R"("num_hidden_layers": 8)";
  std::string text = kLlama;
  text.replace(text.find(R"("num_hidden_layers": 2)"), 22, layers);
  auto dir = make_temp_dir("config");
  text.replace(text.find("LlamaForCausalLM"), 16, "SmolLM3ForCausalLM");
  write_text(dir / "config.json", text);
  const ModelConfig c = load_model_config(dir / "config.json");
  for (size_t i = 0; i < c.layers.size(); ++i)
    EXPECT_EQ(c.layers[i].rope, (i + 1) % 4 != 0) << i;  // HF's default interval: every 4th
  const ModelConfig listed = config_of("SmolLM3ForCausalLM", R"("no_rope_layers": [0, 1])");
  EXPECT_FALSE(listed.layers[0].rope);
  EXPECT_TRUE(listed.layers[1].rope);
  EXPECT_NE(error_of(R"({"architectures": ["SmolLM3ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 100, "no_rope_layers": [1, 2]})")
                .find("no_rope_layers"),
            std::string::npos);
}

TEST(ConfigTest, RejectsBadInputWithFieldName) {
  EXPECT_NE(error_of("{not json").find("config.json: parse error at byte"), std::string::npos);
  EXPECT_NE(error_of(R"({"architectures": ["BertModel"], "hidden_size": 8})").find("BertModel"),
            std::string::npos);
  std::string no_hidden = kLlama;
  no_hidden.replace(no_hidden.find("\"hidden_size\": 64"), 17, "\"hidden_size\": -1");
  EXPECT_NE(error_of(no_hidden).find("'hidden_size'"), std::string::npos);
  std::string bad_kv = kLlama;
  bad_kv.replace(bad_kv.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  EXPECT_NE(error_of(bad_kv).find("num_key_value_heads"), std::string::npos);
  std::string bad_scaling = kLlama;
  bad_scaling.insert(1, R"("rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, )");
  EXPECT_NE(error_of(bad_scaling).find("'dynamic' is not supported"), std::string::npos);
  std::string truncated = kLlama;
  EXPECT_NE(error_of(truncated.substr(0, truncated.size() / 2)).find("config.json"),
            std::string::npos);
  EXPECT_NE(error_of("").find("config.json"), std::string::npos);
}

// kLlama with one field's value replaced (or added when absent).
std::string llama_with(const std::string& field, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(kLlama);
  j.erase(field);
  std::string text = j.dump();
  text.insert(1, "\"" + field + "\": " + value + ", ");
  return text;
}

// Regression: dump() of a value nested 200k deep, built for the error message,
// overflowed the stack (SIGSEGV). The parser now refuses deep nesting outright.
TEST(ConfigTest, DeeplyNestedValueIsRefusedNotACrash) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const char* field : {"hidden_size", "eos_token_id", "rope_scaling"}) {
    const std::string msg = error_of(llama_with(field, deep));
    EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << field << ": " << msg;
  }
  // Moderate nesting still parses: the limit is far above what real files use.
  const std::string ok = std::string(20, '[') + "1" + std::string(20, ']');
  EXPECT_NE(error_of(llama_with("hidden_size", ok)).find("'hidden_size'"), std::string::npos);
}

// Regression: these floats were accepted silently (1e300 became inf as a float,
// a negative softcap or zero RoPE base ran and produced garbage).
TEST(ConfigTest, NonFiniteAndOutOfRangeFloatsAreNamed) {
  const std::pair<const char*, const char*> llama_cases[] = {
      {"rope_theta", "1e300"}, {"rope_theta", "0"},       {"rope_theta", "-5"},
      {"rms_norm_eps", "0"},   {"rms_norm_eps", "-1e-6"}, {"rms_norm_eps", "1e39"},
  };
  for (const auto& [field, value] : llama_cases) {
    const std::string msg = error_of(llama_with(field, value));
    EXPECT_NE(msg.find(std::string("'") + field + "'"), std::string::npos)
        << field << "=" << value << ": " << msg;
  }
  nlohmann::json gemma = nlohmann::json::parse(kLlama);
  gemma["architectures"] = {"Gemma3ForCausalLM"};
  const std::pair<const char*, double> gemma_cases[] = {
      {"query_pre_attn_scalar", 0},     {"query_pre_attn_scalar", -256},
      {"final_logit_softcapping", -30}, {"rope_local_base_freq", 0},
      {"rope_local_base_freq", 1e300},
  };
  for (const auto& [field, value] : gemma_cases) {
    nlohmann::json j = gemma;
    j[field] = value;
    const std::string msg = error_of(j.dump());
    EXPECT_NE(msg.find(std::string("'") + field + "'"), std::string::npos)
        << field << "=" << value << ": " << msg;
  }
  gemma["final_logit_softcapping"] = nullptr;  // null and 0 both mean off
  EXPECT_EQ(error_of(gemma.dump()), "");
}

// Regression: 2^32 + 2 wrapped to the valid id 2.
TEST(ConfigTest, TokenIdsDoNotWrap) {
  for (const char* field : {"eos_token_id", "bos_token_id"})
    for (const char* value : {"4294967298", "-1", "100", "[2, 4294967298]", "2.5"}) {
      if (std::string(field) == "bos_token_id" && value[0] == '[') continue;
      const std::string msg = error_of(llama_with(field, value));
      EXPECT_NE(msg.find(std::string("'") + field + "'"), std::string::npos)
          << field << "=" << value << ": " << msg;
    }
  EXPECT_EQ(error_of(llama_with("eos_token_id", "[2, 99]")), "");
}

// Regression: 1e9 layers sized a per-layer table (12 GB) before any tensor
// was looked at; 2^31 - 1 threw std::bad_alloc.
TEST(ConfigTest, LayerCountIsBoundedBeforeAllocating) {
  for (const char* value : {"1000000000", "2147483647"}) {
    const std::string msg = error_of(llama_with("num_hidden_layers", value));
    EXPECT_NE(msg.find("'num_hidden_layers'"), std::string::npos) << msg;
  }
}

// Error messages quote at most a short excerpt of a huge value.
TEST(ConfigTest, QuotedValuesAreCut) {
  const std::string msg =
      error_of(llama_with("hidden_size", "\"" + std::string(1 << 20, 'x') + "\""));
  EXPECT_NE(msg.find("'hidden_size'"), std::string::npos);
  EXPECT_LT(msg.size(), 300u) << msg.size();
}

TEST(ConfigTest, MissingFileSaysSo) {
  EXPECT_THROW(load_model_config("/nonexistent/config.json"), Error);
}

}  // namespace
}  // namespace edgellm
