// A bare GGUF's config and tokenizer from its metadata alone (models/gguf_config,
// tokenizer/gguf_tokenizer), on small files written here and on the store's
// real models against the config.json converted from them.
#include <gtest/gtest.h>

#include <cmath>

#include "edgellm/bf16.h"
#include "edgellm/error.h"
#include "edgellm/model_store.h"
#include "edgellm/tokenizer.h"
#include "gguf_writer.h"
#include "models/gguf_config.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::GgufWriter;

const std::string kSpace = "\xE2\x96\x81";  // ▁

class GgufModelTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = testing::make_temp_dir("gguf_model");
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const GgufWriter& w, const std::string& name = "m.gguf") {
    const auto bytes = w.bytes();
    const auto p = dir_ / name;
    testing::write_text(p, std::string(bytes.begin(), bytes.end()));
    return p;
  }
  ModelConfig config(const GgufWriter& w) {
    return model_config_from_gguf(GgufFile::open(write(w)));
  }
  std::string config_error(const GgufWriter& w) {
    try {
      config(w);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
};

// The shape of make_fixture.py's tiny models: head_dim (24) is not hidden / heads (16).
GgufWriter tiny(const std::string& arch, bool with_output = false, uint32_t eos = 2) {
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
  w.kv_f32(arch + ".rope.freq_base", 500000.0f);
  w.kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", eos);
  w.tensor("token_embd.weight", 0, {64, 10}, std::vector<uint8_t>(64 * 10 * 4));
  if (with_output) w.tensor("output.weight", 0, {64, 10}, std::vector<uint8_t>(64 * 10 * 4));
  return w;
}

TEST_F(GgufModelTest, LlamaConfigFromMetadata) {
  GgufWriter w = tiny("llama", /*with_output=*/true);
  w.kv_str("llama.rope.scaling.type", "linear");
  w.kv_f32("llama.rope.scaling.factor", 2.5f);
  const ModelConfig c = config(w);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_EQ(c.vocab_size, 10);  // the embedding's rows
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(c.rope_scaling.factor, 2.5f);
  EXPECT_EQ(c.query_scale, 1.0f / std::sqrt(24.0f));
  EXPECT_FALSE(c.qk_norm || c.sandwich_norms || c.norm_adds_one || c.attention_bias);
  ASSERT_EQ(c.layers.size(), 3u);
  for (const LayerSpec& l : c.layers) {
    EXPECT_EQ(l.sliding_window, 0);
    EXPECT_EQ(l.rope_theta, 500000.0f);
  }
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
}

// Llama 3.2's RoPE scaling as llama.cpp stores it: one factor per rotary pair.
TEST_F(GgufModelTest, Llama3RopeFactorsGiveTheirParameters) {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.context_length", 131072);
  w.kv_u32("llama.embedding_length", 2048);
  w.kv_u32("llama.block_count", 1);
  w.kv_u32("llama.feed_forward_length", 64);
  w.kv_u32("llama.attention.head_count", 32);
  w.kv_f32("llama.rope.freq_base", 500000.0f);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.tensor("token_embd.weight", 0, {2048, 2}, std::vector<uint8_t>(2048 * 2 * 4));
  std::vector<uint8_t> factors;
  for (int i = 0; i < 32; ++i) {  // HF's llama3 rule: factor 32, low 1, high 4, context 8192
    const double wavelen = 2 * M_PI * std::pow(500000.0, 2.0 * i / 64);
    double f = 32;
    if (wavelen < 8192 / 4.0)
      f = 1;
    else if (wavelen <= 8192) {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      f = 1 / ((1 - smooth) / 32 + smooth);
    }
    GgufWriter::pod(factors, static_cast<float>(f));
  }
  w.tensor("rope_freqs.weight", 0, {32}, factors);
  const ModelConfig c = config(w);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::llama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
}

TEST_F(GgufModelTest, QwenFamilySwitches) {
  const ModelConfig q2 = config(tiny("qwen2"));
  EXPECT_EQ(q2.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_TRUE(q2.tie_word_embeddings);  // no output.weight
  const ModelConfig q3 = config(tiny("qwen3"));
  EXPECT_EQ(q3.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.attention_bias);
}

TEST_F(GgufModelTest, Gemma3ConfigFromMetadata) {
  GgufWriter w = tiny("gemma3");
  w.kv_u32("gemma3.attention.sliding_window", 8);
  w.kv_u32("gemma3.attention.sliding_window_pattern", 3);
  w.kv_f32("gemma3.rope.freq_base_swa", 20000.0f);
  w.kv_f32("gemma3.final_logit_softcapping", 4.0f);
  const ModelConfig c = config(w);
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c.hidden_act, Activation::gelu_tanh);
  EXPECT_TRUE(c.qk_norm && c.sandwich_norms && c.norm_adds_one && c.tie_word_embeddings);
  EXPECT_EQ(c.embedding_scale, round_to_bf16(8.0f));
  EXPECT_EQ(c.query_scale, 1.0f / std::sqrt(24.0f));  // llama.cpp: 1/sqrt(head_dim)
  EXPECT_EQ(c.final_logit_softcap, 4.0f);
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_EQ(c.layers[0].sliding_window, 8);
  EXPECT_EQ(c.layers[0].rope_theta, 20000.0f);
  EXPECT_FALSE(c.layers[0].rope_scaled);
  EXPECT_EQ(c.layers[1].sliding_window, 8);
  EXPECT_EQ(c.layers[2].sliding_window, 0);  // every third layer is global
  EXPECT_EQ(c.layers[2].rope_theta, 500000.0f);

  GgufWriter flags = tiny("gemma3");
  flags.kv_u32("gemma3.attention.sliding_window", 8);
  flags.kv_i32_array("gemma3.attention.sliding_window_pattern", {0, 1, 0});  // bool per layer
  const ModelConfig f = config(flags);
  EXPECT_EQ(f.layers[0].sliding_window, 0);
  EXPECT_EQ(f.layers[1].sliding_window, 8);
  EXPECT_EQ(f.layers[2].sliding_window, 0);
}

TEST_F(GgufModelTest, BadMetadataIsNamed) {
  GgufWriter mamba = tiny("mamba");
  const std::string arch = config_error(mamba);
  EXPECT_NE(arch.find("architecture 'mamba' is not supported"), std::string::npos) << arch;
  EXPECT_NE(arch.find("(supported: gemma3, gpt-oss, granite, granitemoe, llama, olmo2, olmoe, "
                      "phi3, qwen2, qwen2moe, qwen3, qwen3moe, smollm3)"),
            std::string::npos)
      << arch;

  GgufWriter no_layers;
  no_layers.kv_str("general.architecture", "llama");
  no_layers.kv_u32("llama.embedding_length", 64);
  no_layers.kv_u32("llama.feed_forward_length", 96);
  const std::string missing = config_error(no_layers);
  EXPECT_NE(missing.find("metadata 'llama.block_count' is missing"), std::string::npos) << missing;

  GgufWriter yarn = tiny("llama");
  yarn.kv_str("llama.rope.scaling.type", "yarn");
  const std::string scaling = config_error(yarn);
  EXPECT_NE(scaling.find("'yarn' is not supported (supported: none, linear)"), std::string::npos)
      << scaling;

  GgufWriter bad_eos = tiny("llama", false, /*eos=*/10);  // = the embedding's rows
  const std::string eos = config_error(bad_eos);
  EXPECT_NE(eos.find("outside the vocabulary of 10"), std::string::npos) << eos;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position, b.rope_scaling.original_max_position);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.sandwich_norms, b.sandwich_norms);
  EXPECT_EQ(a.norm_adds_one, b.norm_adds_one);
  EXPECT_EQ(a.embedding_scale, b.embedding_scale);
  EXPECT_EQ(a.query_scale, b.query_scale);
  EXPECT_EQ(a.final_logit_softcap, b.final_logit_softcap);
  EXPECT_EQ(a.attn_logit_softcap, b.attn_logit_softcap);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].sliding_window, b.layers[i].sliding_window) << "layer " << i;
    EXPECT_EQ(a.layers[i].rope_theta, b.layers[i].rope_theta) << "layer " << i;
    EXPECT_EQ(a.layers[i].rope_scaled, b.layers[i].rope_scaled) << "layer " << i;
  }
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
}

// The converter (scripts/fetch_model.py) wrote config.json from this very file.
TEST_F(GgufModelTest, StoreModelsEqualTheirConvertedConfig) {
  for (const char* name : {"smollm2-135m-instruct", "gemma3-270m"}) {
    const auto dir = model_store() / name;
    if (!std::filesystem::exists(dir / "model.gguf"))
      GTEST_SKIP() << "no " << (dir / "model.gguf") << ": run `make fetch`";
    SCOPED_TRACE(name);
    expect_same_config(model_config_from_gguf(GgufFile::open(dir / "model.gguf")),
                       load_model_config(dir / "config.json"));
  }
}

// ---- tokenizer.ggml.* -------------------------------------------------------

TEST_F(GgufModelTest, Gpt2VocabularyWithMergesAndControlTokens) {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "gpt-2");
  // Byte-level symbols: "Ġ" is the space byte.
  w.kv_str_array("tokenizer.ggml.tokens", {"<s>", "a", "b", "\xC4\xA0", "ab",
                                           "\xC4\xA0"
                                           "ab"});
  w.kv_i32_array("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 1});
  w.kv_str_array("tokenizer.ggml.merges", {"a b", "\xC4\xA0 ab", "a zz"});  // last: unknown
  w.kv_u32("tokenizer.ggml.bos_token_id", 0);
  const Tokenizer t = Tokenizer::from_gguf(write(w));
  EXPECT_EQ(t.encode("ab ab"), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(t.encode("<s>ba"), (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(t.encode("ab", /*add_special_tokens=*/true), (std::vector<int32_t>{4}));  // no bos
  EXPECT_TRUE(t.is_special(0));
  EXPECT_EQ(t.decode(std::vector<int32_t>{0, 4, 5}, true), "ab ab");
}

// Gemma-style: no merges in the file; the best-scoring piece merges first.
TEST_F(GgufModelTest, SentencePieceScoresRankTheMerges) {
  GgufWriter w;
  w.kv_str("general.architecture", "gemma3");
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_str("tokenizer.ggml.pre", "default");
  w.kv_str_array("tokenizer.ggml.tokens",
                 {"<unk>", "<bos>", kSpace, "a", "b", "ab", kSpace + "a", "<0x63>", "  "});
  w.kv_f32_array("tokenizer.ggml.scores", {0, 0, -3, -4, -5, -1, -2, 0, 0});
  w.kv_i32_array("tokenizer.ggml.token_type", {2, 3, 1, 1, 1, 1, 1, 6, 4});
  w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  const Tokenizer t = Tokenizer::from_gguf(write(w));
  // "ab" (-1) outranks "▁a" (-2): ▁ a b -> ▁ ab, not ▁a b.
  EXPECT_EQ(t.encode(" ab"), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(t.encode("c"), (std::vector<int32_t>{7}));            // byte fallback
  EXPECT_EQ(t.encode("d"), (std::vector<int32_t>{0}));            // unknown
  EXPECT_EQ(t.encode("  a"), (std::vector<int32_t>{8, 3}));       // user-defined "▁▁"
  EXPECT_EQ(t.encode("ab", true), (std::vector<int32_t>{1, 5}));  // add_bos_token by default
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 2, 5, 7}, true), " abc");
}

TEST_F(GgufModelTest, UnsupportedTokenizerIsNamed) {
  GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "falcon");
  w.kv_str_array("tokenizer.ggml.tokens", {"a"});
  try {
    Tokenizer::from_gguf(write(w));
    ADD_FAILURE() << "loaded an unsupported pre-tokenizer";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'tokenizer.ggml.pre' is 'falcon'"), std::string::npos) << m;
    EXPECT_NE(m.find("(supported: gpt-2, gpt-4o, llama-bpe, qwen2, smollm)"), std::string::npos)
        << m;
  }
}

TEST_F(GgufModelTest, BadTokenTypeIsNamed) {
  GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b"});
  w.kv_i32_array("tokenizer.ggml.token_type", {1, -7});
  try {
    Tokenizer::from_gguf(write(w));
    ADD_FAILURE() << "loaded a token type of -7";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tokenizer.ggml.token_type' holds -7"), std::string::npos)
        << e.what();
  }
}

// tokenizer.json's Unicode normalizers (Qwen2's NFC) compose what they should.
TEST_F(GgufModelTest, NfcNormalizerComposes) {
  testing::write_text(dir_ / "tokenizer.json", R"({
    "version": "1.0", "normalizer": {"type": "NFC"}, "pre_tokenizer": null,
    "model": {"type": "BPE", "vocab": {"\u00e9": 0, "e": 1, "\u0301": 2}, "merges": []}})");
  const Tokenizer t = Tokenizer::load(dir_);
  EXPECT_EQ(t.encode("e\xCC\x81"), (std::vector<int32_t>{0}));  // e + U+0301 -> é
  EXPECT_EQ(t.encode("\xC3\xA9"), (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace edgellm
