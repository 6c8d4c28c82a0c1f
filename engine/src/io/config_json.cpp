// config.json -> ModelConfig. Every field the forward pass depends on is
// validated here, so a bad or unsupported config fails with one line naming
// the file and field instead of deep inside the forward pass.
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "edgellm/bf16.h"
#include "edgellm/config.h"
#include "edgellm/error.h"

namespace edgellm {

namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string file;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(file + ": field '" + field + "' " + what);
  }
  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int positive_int(const char* key) const {
    if (!has(key)) fail(key, "is missing");
    if (!j[key].is_number_integer() || j[key].get<long long>() <= 0 ||
        j[key].get<long long>() > (1ll << 31) - 1)
      fail(key, "must be a positive integer, got " + j[key].dump());
    return j[key].get<int>();
  }
  int positive_int_or(const char* key, int fallback) const {
    return has(key) ? positive_int(key) : fallback;
  }
  float number_or(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) fail(key, "must be a number, got " + j[key].dump());
    return j[key].get<float>();
  }
  bool bool_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) fail(key, "must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string()) fail(key, "must be a string, got " + j[key].dump());
    return j[key].get<std::string>();
  }
};

const std::set<std::string> kSupported = {"LlamaForCausalLM", "MistralForCausalLM",
                                          "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                          "Gemma3ForCausalLM"};

std::string supported_list() {
  std::string s;
  for (const auto& a : kSupported) s += (s.empty() ? "" : ", ") + a;
  return s;
}

void read_rope_scaling(const Reader& r, ModelConfig& c) {
  if (!r.has("rope_scaling")) return;
  const json& rs = r.j["rope_scaling"];
  if (!rs.is_object()) r.fail("rope_scaling", "must be an object or null");
  Reader s{rs, r.file};
  const std::string type = s.string_or("rope_type", s.string_or("type", "default"));
  if (type == "default") return;
  c.rope_scaling.factor = s.number_or("factor", 1.0f);
  if (!(c.rope_scaling.factor > 0.0f)) r.fail("rope_scaling.factor", "must be positive");
  if (type == "linear") {
    c.rope_scaling.type = RopeScaling::Type::linear;
  } else if (type == "llama3") {
    c.rope_scaling.type = RopeScaling::Type::llama3;
    c.rope_scaling.low_freq_factor = s.number_or("low_freq_factor", 1.0f);
    c.rope_scaling.high_freq_factor = s.number_or("high_freq_factor", 4.0f);
    c.rope_scaling.original_max_position =
        s.positive_int_or("original_max_position_embeddings", 8192);
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
      r.fail("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
  } else {
    r.fail("rope_scaling.rope_type",
           "'" + type + "' is not supported (supported: default, linear, llama3)");
  }
}

void read_eos(const Reader& r, ModelConfig& c) {
  if (!r.has("eos_token_id")) return;
  const json& e = r.j["eos_token_id"];
  if (e.is_number_integer()) {
    c.eos_token_ids.push_back(e.get<int>());
  } else if (e.is_array()) {
    for (const auto& v : e) {
      if (!v.is_number_integer()) r.fail("eos_token_id", "must hold integers, got " + e.dump());
      c.eos_token_ids.push_back(v.get<int>());
    }
  } else {
    r.fail("eos_token_id", "must be an integer or a list, got " + e.dump());
  }
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  const std::string file = config_json.string();
  std::ifstream in(config_json);
  check(in.good(), file + ": cannot open (is the checkpoint directory complete?)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(file + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  check(j.is_object(), file + ": must hold a JSON object");
  Reader r{j, file};

  ModelConfig c;
  if (!r.has("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string())
    r.fail("architectures", "must list the model class, e.g. [\"LlamaForCausalLM\"]");
  c.architecture = j["architectures"][0].get<std::string>();
  if (!kSupported.count(c.architecture))
    r.fail("architectures",
           "names '" + c.architecture +
               "', which the engine does not support (supported: " + supported_list() + ")");
  const bool gemma = c.architecture == "Gemma3ForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";

  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.num_layers = r.positive_int("num_hidden_layers");
  c.num_heads = r.positive_int("num_attention_heads");
  c.num_kv_heads = r.positive_int_or("num_key_value_heads", c.num_heads);
  c.head_dim = r.positive_int_or("head_dim", c.hidden_size / c.num_heads);
  c.vocab_size = r.positive_int("vocab_size");
  c.max_position_embeddings = r.positive_int_or("max_position_embeddings", 2048);
  c.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6f);
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c.num_heads) + ")");
  if (c.head_dim % 2 != 0) r.fail("head_dim", "must be even for RoPE");
  if (!(c.rms_norm_eps > 0.0f)) r.fail("rms_norm_eps", "must be positive");

  const std::string act =
      r.string_or(gemma ? "hidden_activation" : "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
  if (act == "silu") {
    c.hidden_act = Activation::silu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_tanh") {
    c.hidden_act = Activation::gelu_tanh;
  } else {
    r.fail(gemma ? "hidden_activation" : "hidden_act",
           "'" + act + "' is not supported (supported: silu, gelu_pytorch_tanh)");
  }
  if (r.bool_or("mlp_bias", false)) r.fail("mlp_bias", "true is not supported");
  if (r.bool_or("use_sliding_window", false) && !gemma)
    r.fail("use_sliding_window", "true is not supported");

  c.tie_word_embeddings = r.bool_or("tie_word_embeddings", gemma);
  c.attention_bias = qwen2 || r.bool_or("attention_bias", false);
  c.qk_norm = qwen3 || gemma;
  c.sandwich_norms = gemma;
  c.norm_adds_one = gemma;
  c.query_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (gemma) {
    // Gemma scales embeddings by sqrt(hidden); HF casts the scale to the weight dtype (bf16).
    c.embedding_scale = round_to_bf16(std::sqrt(static_cast<float>(c.hidden_size)));
    c.query_scale =
        1.0f / std::sqrt(r.number_or("query_pre_attn_scalar", static_cast<float>(c.head_dim)));
    c.final_logit_softcap = r.number_or("final_logit_softcapping", 0.0f);
    // attn_logit_softcapping is not read: transformers' Gemma3Attention never passes it to
    // the attention function, so Gemma 3 runs without it (tests/test_family_fixtures.py).
  }
  read_rope_scaling(r, c);

  const float rope_theta = r.number_or("rope_theta", gemma ? 1e6f : 10000.0f);
  if (!(rope_theta > 0.0f)) r.fail("rope_theta", "must be positive");
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{0, rope_theta, true});
  if (gemma) {
    // Local (sliding) layers use their own RoPE base without scaling; global ones the main base.
    const int window = r.positive_int_or("sliding_window", 512);
    const float local_theta = r.number_or("rope_local_base_freq", 10000.0f);
    std::vector<bool> sliding(static_cast<size_t>(c.num_layers));
    if (r.has("layer_types")) {
      const json& lt = j["layer_types"];
      if (!lt.is_array() || lt.size() != static_cast<size_t>(c.num_layers))
        r.fail("layer_types",
               "must list one entry per layer (" + std::to_string(c.num_layers) + ")");
      for (size_t i = 0; i < lt.size(); ++i) {
        const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
        if (t != "sliding_attention" && t != "full_attention")
          r.fail("layer_types",
                 "entry " + std::to_string(i) + " must be sliding_attention or full_attention");
        sliding[i] = t == "sliding_attention";
      }
    } else {
      const int pattern = r.positive_int_or("sliding_window_pattern", 6);
      for (int i = 0; i < c.num_layers; ++i) sliding[i] = (i + 1) % pattern != 0;
    }
    for (int i = 0; i < c.num_layers; ++i)
      if (sliding[i]) c.layers[i] = LayerSpec{window, local_theta, false};
  }

  c.bos_token_id = r.has("bos_token_id") && j["bos_token_id"].is_number_integer()
                       ? j["bos_token_id"].get<int>()
                       : -1;
  read_eos(r, c);
  for (int id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      r.fail("eos_token_id", "holds " + std::to_string(id) + ", outside the vocabulary");
  return c;
}

}  // namespace edgellm
