// config.json -> ModelConfig. Every field the forward pass depends on is
// validated here, so a bad or unsupported config fails with one line naming
// the file and field instead of deep inside the forward pass.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "edgellm/bf16.h"
#include "edgellm/config.h"
#include "edgellm/error.h"
#include "edgellm/json_file.h"

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
  std::string got(const char* key) const { return ", got " + json_excerpt(j[key]); }
  int positive_int(const char* key, long long max = INT32_MAX) const {
    if (!has(key)) fail(key, "is missing");
    if (!j[key].is_number_integer() || j[key].get<long long>() <= 0 ||
        j[key].get<long long>() > max)
      fail(key, "must be a positive integer up to " + std::to_string(max) + got(key));
    return j[key].get<int>();
  }
  int positive_int_or(const char* key, int fallback) const {
    return has(key) ? positive_int(key) : fallback;
  }
  int count_or(const char* key, int fallback) const {  // 0 allowed
    if (!has(key)) return fallback;
    if (!j[key].is_number_integer() || j[key].get<long long>() < 0 ||
        j[key].get<long long>() > INT32_MAX)
      fail(key, "must be a non-negative integer" + got(key));
    return j[key].get<int>();
  }
  // A float field: finite and representable (1e300 would become inf as a float).
  float number_or(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) fail(key, "must be a number" + got(key));
    const double v = j[key].get<double>();
    if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
      fail(key, "must be a finite number within float range" + got(key));
    return static_cast<float>(v);
  }
  float positive_number_or(const char* key, float fallback) const {
    const float v = number_or(key, fallback);
    if (!(v > 0.0f)) fail(key, "must be positive" + got(key));
    return v;
  }
  // Logit softcaps: 0 (or absent) turns them off; a negative cap is a typo.
  float softcap_or_zero(const char* key) const {
    const float v = number_or(key, 0.0f);
    if (v < 0.0f) fail(key, "must be positive, or 0/null for no softcap" + got(key));
    return v;
  }
  // A token id: an integer in [0, vocab_size).
  int token_id(const json& v, const char* key, int vocab_size) const {
    if (!v.is_number_integer()) fail(key, "must hold integer token ids, got " + json_excerpt(v));
    const long long id =
        v.is_number_unsigned() && v.get<unsigned long long>() > INT32_MAX ? -1 : v.get<long long>();
    if (id < 0 || id >= vocab_size)
      fail(key, "holds " + json_excerpt(v) + ", outside the vocabulary of " +
                    std::to_string(vocab_size));
    return static_cast<int>(id);
  }
  bool bool_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) fail(key, "must be true or false" + got(key));
    return j[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string()) fail(key, "must be a string" + got(key));
    return j[key].get<std::string>();
  }
};

// Far above any published model (Llama 3.1 405B has 126 layers).
constexpr int kMaxLayers = 1 << 14;

const std::set<std::string> kSupported = {"LlamaForCausalLM",      "MistralForCausalLM",
                                          "Qwen2ForCausalLM",      "Qwen3ForCausalLM",
                                          "Gemma3ForCausalLM",     "GraniteForCausalLM",
                                          "SmolLM3ForCausalLM",    "Olmo2ForCausalLM",
                                          "Qwen3MoeForCausalLM",   "OlmoeForCausalLM",
                                          "Phi3ForCausalLM",       "GptOssForCausalLM",
                                          "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
                                          "Qwen2MoeForCausalLM"};

bool is_granite_moe(const std::string& arch) {
  return arch == "GraniteMoeForCausalLM" || arch == "GraniteMoeSharedForCausalLM";
}

std::string supported_list() {
  std::string s;
  for (const auto& a : kSupported) s += (s.empty() ? "" : ", ") + a;
  return s;
}

// Phi-3's LongRoPE (HF _compute_longrope_parameters): inverse frequencies divided by
// short_factor, cos/sin times sqrt(1 + ln(factor) / ln(original)), factor being
// max_position_embeddings / original_max_position_embeddings (top-level fields).
void read_longrope(const Reader& r, const Reader& s, ModelConfig& c) {
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::longrope;
  rs.original_max_position = r.positive_int_or("original_max_position_embeddings", 4096);
  const size_t half = static_cast<size_t>(c.rotary_dims()) / 2;
  for (const char* key : {"short_factor", "long_factor"}) {
    const std::string field = std::string("rope_scaling.") + key;
    if (!s.has(key) || !s.j[key].is_array() || s.j[key].size() != half)
      r.fail(field, "must list " + std::to_string(half) + " numbers (rotary_dim / 2)");
    for (const json& v : s.j[key])
      if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>()))
        r.fail(field, "must hold positive finite numbers, got " + json_excerpt(v));
  }
  for (const json& v : s.j["short_factor"]) rs.short_factor.push_back(v.get<float>());
  const double factor = static_cast<double>(c.max_position_embeddings) / rs.original_max_position;
  rs.factor = static_cast<float>(factor);
  rs.attention_factor =
      factor <= 1.0 ? 1.0f
                    : static_cast<float>(
                          std::sqrt(1.0 + std::log(factor) / std::log(rs.original_max_position)));
}

// YaRN (HF _compute_yarn_parameters): original_max_position_embeddings falls back to
// max_position_embeddings; attention_factor, absent, is 0.1 ln(factor) + 1 (or the mscale ratio
// where mscale and mscale_all_dim are both set).
void read_yarn(const Reader& r, const Reader& s, ModelConfig& c) {
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::yarn;
  rs.original_max_position =
      s.positive_int_or("original_max_position_embeddings", c.max_position_embeddings);
  rs.beta_fast = s.positive_number_or("beta_fast", 32.0f);
  rs.beta_slow = s.positive_number_or("beta_slow", 1.0f);
  rs.truncate = s.bool_or("truncate", true);
  if (!(rs.factor >= 1.0f))
    r.fail("rope_scaling.factor", "must be at least 1 for yarn" + s.got("factor"));
  const auto mscale = [&](double m) {
    return rs.factor <= 1.0f ? 1.0 : 0.1 * m * std::log(rs.factor) + 1.0;
  };
  const double m = s.number_or("mscale", 0.0f), m_all = s.number_or("mscale_all_dim", 0.0f);
  const double inferred = m != 0.0 && m_all != 0.0 ? mscale(m) / mscale(m_all) : mscale(1.0);
  rs.attention_factor = s.positive_number_or("attention_factor", static_cast<float>(inferred));
}

void read_rope_scaling(const Reader& r, ModelConfig& c) {
  if (!r.has("rope_scaling")) return;
  const json& rs = r.j["rope_scaling"];
  if (!rs.is_object()) r.fail("rope_scaling", "must be an object or null");
  Reader s{rs, r.file};
  std::string type = s.string_or("rope_type", s.string_or("type", "default"));
  if (c.architecture == "Phi3ForCausalLM") {
    // Phi3Config renames the old "su" and "yarn" types to longrope and accepts nothing else.
    if (type == "su" || type == "yarn") type = "longrope";
    if (type != "longrope")
      r.fail("rope_scaling.type",
             "'" + type + "' is not supported for Phi-3 (supported: longrope)");
    return read_longrope(r, s, c);
  }
  if (type == "default") return;
  c.rope_scaling.factor = s.positive_number_or("factor", 1.0f);
  if (type == "linear") {
    c.rope_scaling.type = RopeScaling::Type::linear;
  } else if (type == "llama3") {
    c.rope_scaling.type = RopeScaling::Type::llama3;
    c.rope_scaling.low_freq_factor = s.positive_number_or("low_freq_factor", 1.0f);
    c.rope_scaling.high_freq_factor = s.positive_number_or("high_freq_factor", 4.0f);
    c.rope_scaling.original_max_position =
        s.positive_int_or("original_max_position_embeddings", 8192);
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
      r.fail("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
  } else if (type == "yarn") {
    read_yarn(r, s, c);
  } else {
    r.fail("rope_scaling.rope_type",
           "'" + type + "' is not supported (supported: default, linear, llama3, yarn)");
  }
}

void read_eos(const Reader& r, ModelConfig& c) {
  if (!r.has("eos_token_id")) return;
  const json& e = r.j["eos_token_id"];
  if (e.is_array()) {
    for (const auto& v : e) c.eos_token_ids.push_back(r.token_id(v, "eos_token_id", c.vocab_size));
  } else if (e.is_number()) {
    c.eos_token_ids.push_back(r.token_id(e, "eos_token_id", c.vocab_size));
  } else {
    r.fail("eos_token_id", "must be an integer or a list" + r.got("eos_token_id"));
  }
}

// Which layers attend through a sliding window, and its width, as transformers decides:
// Gemma 3 by layer_types (else every sliding_window_pattern-th layer is global); Mistral
// windows every layer (sliding_window absent means HF's default 4096, null means none);
// Qwen2/3 and SmolLM3 by layer_types when use_sliding_window is set, else (Qwen) the layers
// from max_window_layers on. Llama and Granite have no window.
std::pair<int, std::vector<bool>> sliding_layers(const Reader& r, const ModelConfig& c) {
  const std::string& arch = c.architecture;
  const size_t n = static_cast<size_t>(c.num_layers);
  std::vector<bool> sliding(n, false);
  if (arch == "Phi3ForCausalLM") {  // every layer, when sliding_window is set (HF default None)
    if (!r.has("sliding_window")) return {0, sliding};
    sliding.assign(n, true);
    return {r.positive_int("sliding_window"), sliding};
  }
  if (arch == "MistralForCausalLM") {
    if (r.j.contains("sliding_window") && r.j["sliding_window"].is_null()) return {0, sliding};
    sliding.assign(n, true);
    return {r.positive_int_or("sliding_window", 4096), sliding};
  }
  if (arch == "Qwen3MoeForCausalLM") {  // every layer, with use_sliding_window
    if (!r.bool_or("use_sliding_window", false)) return {0, sliding};
    sliding.assign(n, true);
    return {r.positive_int_or("sliding_window", 4096), sliding};
  }
  if (arch == "GptOssForCausalLM" && !r.has("layer_types")) {
    // GptOssConfig's default: even layers (0, 2, ...) slide, odd ones attend to everything.
    for (size_t i = 0; i < n; ++i) sliding[i] = i % 2 == 0;
    return {r.positive_int_or("sliding_window", 128), sliding};
  }
  const bool gemma = arch == "Gemma3ForCausalLM";
  const bool gpt_oss = arch == "GptOssForCausalLM";
  const bool qwen =
      arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" || arch == "SmolLM3ForCausalLM";
  if (!gemma && !qwen && !gpt_oss) return {0, sliding};
  // Qwen's window exists only with use_sliding_window (HF sets it to None otherwise).
  const bool windowed = gemma || gpt_oss || r.bool_or("use_sliding_window", false);
  if (r.has("layer_types")) {
    const json& lt = r.j["layer_types"];
    if (!lt.is_array() || lt.size() != n)
      r.fail("layer_types", "must list one entry per layer (" + std::to_string(n) + ")");
    for (size_t i = 0; i < n; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention")
        r.fail("layer_types",
               "entry " + std::to_string(i) + " must be sliding_attention or full_attention");
      sliding[i] = t == "sliding_attention";
    }
    if (!windowed && std::find(sliding.begin(), sliding.end(), true) != sliding.end())
      r.fail("layer_types", "lists sliding_attention layers but use_sliding_window is false");
  } else if (gemma) {
    const int pattern = r.positive_int_or("sliding_window_pattern", 6);
    for (int i = 0; i < c.num_layers; ++i) sliding[i] = (i + 1) % pattern != 0;
  } else if (windowed) {
    const int first = r.count_or("max_window_layers", 28);
    for (int i = first; i < c.num_layers; ++i) sliding[i] = true;
  }
  if (!windowed) return {0, sliding};
  return {r.positive_int_or("sliding_window", gemma ? 512 : gpt_oss ? 128 : 4096), sliding};
}

// SmolLM3's no_rope_layers: 1 = the layer rotates q and k, 0 = NoPE. Absent, HF makes every
// no_rope_layer_interval-th layer (default 4) NoPE.
void read_nope_layers(const Reader& r, ModelConfig& c) {
  const size_t n = c.layers.size();
  if (!r.has("no_rope_layers")) {
    const int every = r.positive_int_or("no_rope_layer_interval", 4);
    for (size_t i = 0; i < n; ++i) c.layers[i].rope = (i + 1) % every != 0;
    return;
  }
  const json& v = r.j["no_rope_layers"];
  if (!v.is_array() || v.size() != n)
    r.fail("no_rope_layers", "must list one 0 or 1 per layer (" + std::to_string(n) + ")");
  for (size_t i = 0; i < n; ++i) {
    if (v[i] != 0 && v[i] != 1)
      r.fail("no_rope_layers", "entry " + std::to_string(i) + " must be 0 or 1");
    c.layers[i].rope = v[i] == 1;
  }
}

// GraniteMoE (HF GraniteMoeMoE): every layer's experts as wide as intermediate_size, stacked
// in the checkpoint, routed by a softmax over the top-k logits; GraniteMoeShared adds a
// shared MLP of shared_intermediate_size (0: none).
void read_granite_moe(const Reader& r, ModelConfig& c) {
  MoeSpec& m = c.moe;
  m.num_experts = r.positive_int_or("num_local_experts", 8);
  m.experts_per_token = r.positive_int_or("num_experts_per_tok", 2);
  if (m.experts_per_token > m.num_experts)
    r.fail("num_experts_per_tok", "(" + std::to_string(m.experts_per_token) +
                                      ") must not exceed num_local_experts (" +
                                      std::to_string(m.num_experts) + ")");
  m.expert_intermediate_size = c.intermediate_size;
  m.routing = MoeSpec::Routing::topk_then_softmax;
  m.stacked_experts = true;
  if (c.architecture == "GraniteMoeSharedForCausalLM")
    m.shared_intermediate_size = r.count_or("shared_intermediate_size", 0);
  for (LayerSpec& l : c.layers) l.moe = true;
  // HF's config hard-codes "rope" but lets config.json override it; anything else runs
  // without rotary embeddings, which the engine does not implement.
  if (r.string_or("position_embedding_type", "rope") != "rope")
    r.fail("position_embedding_type", "'" + r.j["position_embedding_type"].get<std::string>() +
                                          "' is not supported (supported: rope)");
}

// The experts of a mixture-of-experts family, and which layers use them: Qwen3-MoE and
// Qwen2-MoE every decoder_sparse_step-th layer not in mlp_only_layers (num_experts 0: none),
// OLMoE every layer with experts as wide as intermediate_size. Qwen2-MoE adds a gated shared
// expert to every MoE layer. The defaults are each config class's.
void read_moe(const Reader& r, ModelConfig& c) {
  const bool olmoe = c.architecture == "OlmoeForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2MoeForCausalLM";
  MoeSpec& m = c.moe;
  m.num_experts =
      olmoe ? r.positive_int_or("num_experts", 64) : r.count_or("num_experts", qwen2 ? 60 : 128);
  if (m.num_experts == 0) return;
  m.experts_per_token = r.positive_int_or("num_experts_per_tok", qwen2 ? 4 : 8);
  if (m.experts_per_token > m.num_experts)
    r.fail("num_experts_per_tok", "(" + std::to_string(m.experts_per_token) +
                                      ") must not exceed num_experts (" +
                                      std::to_string(m.num_experts) + ")");
  m.expert_intermediate_size =
      olmoe ? c.intermediate_size : r.positive_int_or("moe_intermediate_size", qwen2 ? 1408 : 768);
  m.norm_topk_prob = r.bool_or("norm_topk_prob", false);
  if (qwen2) {
    m.shared_intermediate_size = r.positive_int_or("shared_expert_intermediate_size", 5632);
    m.shared_expert_gate = true;
  }
  const size_t n = c.layers.size();
  std::vector<bool> dense(n, false);
  if (!olmoe && r.has("mlp_only_layers")) {
    const json& v = r.j["mlp_only_layers"];
    if (!v.is_array()) r.fail("mlp_only_layers", "must list layer indices");
    for (const json& i : v) {
      if (!i.is_number_integer() || i.get<long long>() < 0 ||
          i.get<long long>() >= static_cast<long long>(n))
        r.fail("mlp_only_layers", "entries must be layer indices below " + std::to_string(n));
      dense[i.get<size_t>()] = true;
    }
  }
  const int step = olmoe ? 1 : r.positive_int_or("decoder_sparse_step", 1);
  for (size_t l = 0; l < n; ++l) c.layers[l].moe = !dense[l] && (l + 1) % step == 0;
}

// gpt-oss (HF GptOssConfig): every layer's feed-forward is num_local_experts experts as wide as
// intermediate_size, top num_experts_per_tok of the router logits, softmax over those; router
// and experts carry biases; the experts' clamped SwiGLU (swiglu_oai). HF hard-codes the clamp at
// 7.0 whatever swiglu_limit says, so another value is refused rather than run two ways.
void read_gpt_oss(const Reader& r, ModelConfig& c) {
  MoeSpec& m = c.moe;
  m.num_experts = r.positive_int_or("num_local_experts", 128);
  m.experts_per_token = r.positive_int_or("num_experts_per_tok", 4);
  if (m.experts_per_token > m.num_experts)
    r.fail("num_experts_per_tok", "(" + std::to_string(m.experts_per_token) +
                                      ") must not exceed num_local_experts (" +
                                      std::to_string(m.num_experts) + ")");
  // The original checkpoints repeat it as experts_per_token, which HF does not read.
  if (r.has("experts_per_token") && r.positive_int("experts_per_token") != m.experts_per_token)
    r.fail("experts_per_token", "differs from num_experts_per_tok (HF reads only the latter)");
  m.expert_intermediate_size = c.intermediate_size;
  m.routing = MoeSpec::Routing::topk_then_softmax;
  m.biases = true;
  for (LayerSpec& l : c.layers) l.moe = true;
  c.hidden_act = Activation::swiglu_oai;
  if (r.number_or("swiglu_limit", 7.0f) != 7.0f)
    r.fail("swiglu_limit",
           "must be 7.0, the clamp transformers' GptOssExperts hard-codes" + r.got("swiglu_limit"));
  c.attention_sinks = true;
  // The original checkpoints' experts are MXFP4 blocks (gate_up_proj_blocks / _scales), which
  // the safetensors loader does not read: named here, not as a missing tensor later.
  if (r.has("quantization_config"))
    r.fail("quantization_config",
           "is not supported (the engine reads bf16 / f16 / f32 safetensors or a GGUF file)");
}

}  // namespace

void apply_architecture_switches(ModelConfig& c) {
  const bool gemma = c.architecture == "Gemma3ForCausalLM";
  // Qwen2 hard-codes q/k/v biases and no o_proj bias; Mistral has none at all (HF ignores
  // attention_bias there); the others give all four projections a bias with attention_bias.
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen2moe = c.architecture == "Qwen2MoeForCausalLM";
  // Phi-3 has no biases either (HF reads no attention_bias for it).
  if (c.architecture == "MistralForCausalLM" || c.architecture == "Phi3ForCausalLM")
    c.attention_bias = false;
  c.attention_bias = c.attention_bias || qwen2;
  c.attention_out_bias = c.attention_bias && !qwen2 && !qwen2moe;
  const bool olmo2 = c.architecture == "Olmo2ForCausalLM";
  c.qk_norm = c.architecture == "Qwen3ForCausalLM" || c.architecture == "Qwen3MoeForCausalLM" ||
              gemma || olmo2;
  c.qk_norm_whole = olmo2 || c.architecture == "OlmoeForCausalLM";
  c.qk_norm = c.qk_norm || c.qk_norm_whole;
  c.sandwich_norms = gemma || olmo2;
  c.pre_norms = !olmo2;  // OLMo 2 normalises each block's output, not its input
  c.norm_adds_one = gemma;
  c.fused_projections = c.architecture == "Phi3ForCausalLM";
  c.query_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Gemma scales embeddings by sqrt(hidden); HF casts the scale to the weight dtype (bf16).
  if (gemma) c.embedding_scale = round_to_bf16(std::sqrt(static_cast<float>(c.hidden_size)));
}

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  const std::string file = config_json.string();
  check(std::filesystem::exists(config_json),
        file + ": cannot open (is the checkpoint directory complete?)");
  const json j = read_json_file(config_json);
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

  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  // Bounded before the per-layer table below is allocated; the tensors decide the rest.
  c.num_layers = r.positive_int("num_hidden_layers", kMaxLayers);
  c.num_heads = r.positive_int("num_attention_heads");
  c.num_kv_heads = r.positive_int_or("num_key_value_heads", c.num_heads);
  // OLMoE's and GraniteMoE's attention ignores head_dim: heads are hidden_size / heads wide.
  const bool heads_split_hidden =
      c.architecture == "OlmoeForCausalLM" || is_granite_moe(c.architecture);
  if (is_granite_moe(c.architecture) && c.hidden_size % c.num_heads != 0)
    r.fail("num_attention_heads", "(" + std::to_string(c.num_heads) +
                                      ") must divide hidden_size (" +
                                      std::to_string(c.hidden_size) + ")");
  c.head_dim = heads_split_hidden ? c.hidden_size / c.num_heads
                                  : r.positive_int_or("head_dim", c.hidden_size / c.num_heads);
  // Qwen2MoeAttention raises unless its heads fill hidden_size exactly.
  if (c.architecture == "Qwen2MoeForCausalLM" && c.head_dim * c.num_heads != c.hidden_size)
    r.fail("head_dim", "(" + std::to_string(c.head_dim) + ") times num_attention_heads (" +
                           std::to_string(c.num_heads) + ") must equal hidden_size (" +
                           std::to_string(c.hidden_size) + ")");
  c.vocab_size = r.positive_int("vocab_size");
  c.max_position_embeddings = r.positive_int_or("max_position_embeddings", 2048);
  c.rms_norm_eps = r.positive_number_or("rms_norm_eps", 1e-6f);
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c.num_heads) + ")");
  if (c.head_dim % 2 != 0) r.fail("head_dim", "must be even for RoPE");
  if (c.architecture == "Phi3ForCausalLM") {
    // HF: int(head_dim * partial_rotary_factor) leading dims of each head are rotated.
    r.positive_number_or("partial_rotary_factor", 1.0f);  // validates
    const double part =
        r.has("partial_rotary_factor") ? j["partial_rotary_factor"].get<double>() : 1.0;
    if (part > 1.0)
      r.fail("partial_rotary_factor", "must be at most 1" + r.got("partial_rotary_factor"));
    c.rotary_dim = static_cast<int>(c.head_dim * part);
    if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
      r.fail("partial_rotary_factor",
             "must give an even rotary dimension of at least 2 (head_dim " +
                 std::to_string(c.head_dim) + " x " + std::to_string(part) + " = " +
                 std::to_string(c.rotary_dim) + ")");
  } else if (r.has("partial_rotary_factor") && j["partial_rotary_factor"] != 1) {
    // HF's rotary tables would shrink to the part while these families rotate whole heads.
    r.fail("partial_rotary_factor", "below 1 is implemented for Phi-3 only, not " + c.architecture +
                                        r.got("partial_rotary_factor"));
  }

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

  // Absent, the config class's default (save_pretrained omits a value equal to it).
  c.tie_word_embeddings =
      r.bool_or("tie_word_embeddings", gemma || c.architecture == "SmolLM3ForCausalLM");
  // Qwen2-MoE's q/k/v biases are qkv_bias (default true); it has no o_proj bias. GptOssConfig
  // sets attention_bias (all four projections) unless config.json says otherwise.
  c.attention_bias = c.architecture == "Qwen2MoeForCausalLM"
                         ? r.bool_or("qkv_bias", true)
                         : r.bool_or("attention_bias", c.architecture == "GptOssForCausalLM");
  apply_architecture_switches(c);
  if (gemma) {
    c.query_scale = 1.0f / std::sqrt(r.positive_number_or("query_pre_attn_scalar",
                                                          static_cast<float>(c.head_dim)));
    c.final_logit_softcap = r.softcap_or_zero("final_logit_softcapping");
    // attn_logit_softcapping is not read: transformers' Gemma3Attention never passes it to
    // the attention function, so Gemma 3 runs without it (tests/test_family_fixtures.py).
  }
  if (c.architecture == "GraniteForCausalLM" || is_granite_moe(c.architecture)) {
    // Granite's four multipliers (HF GraniteModel); attention_multiplier replaces
    // 1/sqrt(head_dim) outright.
    c.embedding_scale = r.positive_number_or("embedding_multiplier", 1.0f);
    c.residual_scale = r.positive_number_or("residual_multiplier", 1.0f);
    c.query_scale = r.positive_number_or("attention_multiplier", 1.0f);
    c.logit_divisor = r.positive_number_or("logits_scaling", 1.0f);
  }
  read_rope_scaling(r, c);

  const float rope_theta = r.positive_number_or("rope_theta", gemma ? 1e6f : 10000.0f);
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{0, rope_theta, true});
  const auto [window, sliding] = sliding_layers(r, c);
  // Gemma's local layers use their own RoPE base without scaling; global ones the main base.
  const LayerSpec local =
      gemma ? LayerSpec{window, r.positive_number_or("rope_local_base_freq", 10000.0f), false}
            : LayerSpec{window, rope_theta, true};
  for (int i = 0; i < c.num_layers; ++i)
    if (sliding[i]) c.layers[i] = local;
  if (c.architecture == "SmolLM3ForCausalLM") read_nope_layers(r, c);
  if (c.architecture == "Qwen3MoeForCausalLM" || c.architecture == "OlmoeForCausalLM" ||
      c.architecture == "Qwen2MoeForCausalLM")
    read_moe(r, c);
  if (c.architecture == "GptOssForCausalLM") read_gpt_oss(r, c);
  // Qwen2-MoE's window depends on the attention kernel HF picks (its flash path windows the
  // layers from max_window_layers on, its mask every layer): refused, never guessed.
  if (c.architecture == "Qwen2MoeForCausalLM" && r.bool_or("use_sliding_window", false))
    r.fail("use_sliding_window", "true is not supported for Qwen2MoeForCausalLM");
  if (is_granite_moe(c.architecture)) read_granite_moe(r, c);
  // OLMoE's clamp of q, k and v is not implemented: refused, never ignored.
  if (c.architecture == "OlmoeForCausalLM" && r.has("clip_qkv"))
    r.fail("clip_qkv", "is not supported");

  if (r.has("bos_token_id"))
    c.bos_token_id = r.token_id(j["bos_token_id"], "bos_token_id", c.vocab_size);
  read_eos(r, c);
  return c;
}

}  // namespace edgellm
