#include "models/gguf_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "edgellm/error.h"

namespace edgellm {

namespace {

// Far above any published model, as in config_json.cpp.
constexpr int64_t kMaxLayers = 1 << 14;

struct Meta {
  const GgufFile& g;
  std::string arch;

  std::string key(const std::string& k) const { return arch + "." + k; }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const {
    throw Error(g.path() + ": metadata '" + k + "' " + what);
  }
  int positive_int(const std::string& k, int64_t max = INT32_MAX) const {
    const auto v = g.get_int(key(k));
    if (!v) fail(key(k), "is missing");
    if (*v <= 0 || *v > max)
      fail(key(k), "must be a positive integer up to " + std::to_string(max) + ", got " +
                       std::to_string(*v));
    return static_cast<int>(*v);
  }
  int positive_int_or(const std::string& k, int fallback) const {
    return g.get_int(key(k)) ? positive_int(k) : fallback;
  }
  float positive_float(const std::string& k, std::optional<float> fallback) const {
    const auto v = g.get_float(key(k));
    if (!v && fallback) return *fallback;
    if (!v) fail(key(k), "is missing");
    if (!std::isfinite(*v) || !(*v > 0) || *v > std::numeric_limits<float>::max())
      fail(key(k), "must be a positive finite number, got " + std::to_string(*v));
    return static_cast<float>(*v);
  }
  // A token id of tokenizer.ggml.*, inside the embedding's rows.
  std::optional<int> token_id(const std::string& k, int vocab_size) const {
    const auto v = g.get_int(k);
    if (!v) return std::nullopt;
    if (*v < 0 || *v >= vocab_size)
      fail(k, "holds " + std::to_string(*v) + ", outside the vocabulary of " +
                  std::to_string(vocab_size));
    return static_cast<int>(*v);
  }
};

const char* hf_architecture(const std::string& arch) {
  if (arch == "llama") return "LlamaForCausalLM";
  if (arch == "qwen2") return "Qwen2ForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  if (arch == "gemma3") return "Gemma3ForCausalLM";
  if (arch == "granite") return "GraniteForCausalLM";
  if (arch == "smollm3") return "SmolLM3ForCausalLM";
  if (arch == "qwen3moe") return "Qwen3MoeForCausalLM";
  if (arch == "gpt-oss") return "GptOssForCausalLM";
  if (arch == "qwen2moe") return "Qwen2MoeForCausalLM";
  if (arch == "olmo2") return "Olmo2ForCausalLM";
  if (arch == "olmoe") return "OlmoeForCausalLM";
  if (arch == "phi3") return "Phi3ForCausalLM";
  // GraniteMoeShared too: the same llama.cpp architecture, named by its shared MLP below.
  if (arch == "granitemoe") return "GraniteMoeForCausalLM";
  return nullptr;
}

// Llama 3's RoPE factor of one rotary pair (HF's _compute_llama3_parameters,
// as llama.cpp's converter turns it into a divisor of the frequency).
double llama3_factor(double wavelen, const RopeScaling& s) {
  const double low_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_wavelen = s.original_max_position / s.high_freq_factor;
  if (wavelen < high_wavelen) return 1.0;
  if (wavelen > low_wavelen) return s.factor;
  const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return 1.0 / ((1.0 - smooth) / s.factor + smooth);
}

// llama.cpp keeps Llama 3's frequency-dependent scaling as a tensor of
// per-pair factors (rope_freqs.weight), not HF's parameters. Recovered here:
// the factor is the largest divisor; the pairs between the two wavelength
// thresholds lie on a line that gives the original context and
// high_freq_factor, given low_freq_factor 1 (every Llama 3.x). The result must
// reproduce every stored factor, or the file is refused.
void read_llama3_factors(const Meta& m, const GgufTensor& t, float theta, ModelConfig& c) {
  const std::string what = m.g.path() + ": tensor 'rope_freqs.weight' (Llama 3 RoPE scaling) ";
  const size_t pairs = static_cast<size_t>(c.head_dim / 2);
  check(t.type == GgmlType::F32 && t.dims.size() == 1 && t.dims[0] == pairs,
        what + "must be F32 with one factor per rotary pair (" + std::to_string(pairs) + ")");
  std::vector<double> f(pairs), wavelen(pairs);
  for (size_t i = 0; i < pairs; ++i) {
    float v;
    std::memcpy(&v, t.data + i * sizeof(float), sizeof(float));
    check(std::isfinite(v) && v >= 1.0f, what + "holds a factor below 1 or not finite");
    f[i] = v;
    wavelen[i] = 2.0 * M_PI * std::pow(static_cast<double>(theta), 2.0 * i / c.head_dim);
  }
  RopeScaling& s = c.rope_scaling;
  s.factor = static_cast<float>(*std::max_element(f.begin(), f.end()));
  if (s.factor == 1.0f) return;  // no scaling at all
  s.type = RopeScaling::Type::llama3;
  s.low_freq_factor = 1.0f;
  // smooth = orig / wavelen / (high - 1) - 1 / (high - 1) on the pairs in between.
  std::vector<std::pair<double, double>> line;  // (1 / wavelen, smooth)
  for (size_t i = 0; i < pairs; ++i)
    if (f[i] > 1.0 + 1e-6 && f[i] < s.factor * (1.0 - 1e-6))
      line.emplace_back(1.0 / wavelen[i], (1.0 / f[i] - 1.0 / s.factor) / (1.0 - 1.0 / s.factor));
  check(line.size() >= 2, what +
                              "has fewer than two pairs between its thresholds: its "
                              "parameters cannot be recovered");
  const auto [x0, y0] = line.front();
  const auto [x1, y1] = line.back();
  const double slope = (y1 - y0) / (x1 - x0), intercept = slope * x0 - y0;  // A, B
  check(std::isfinite(slope) && std::isfinite(intercept) && slope > 0 && intercept > 0 &&
            slope / intercept < INT32_MAX && intercept > 1e-6,
        what + "is not Llama 3 scaling (its factors do not fall with frequency)");
  s.original_max_position = static_cast<int>(std::lround(slope / intercept));
  s.high_freq_factor = static_cast<float>(std::round((1.0 + intercept) / intercept * 100) / 100);
  for (size_t i = 0; i < pairs; ++i)
    check(std::fabs(llama3_factor(wavelen[i], s) - f[i]) <= 1e-4 * f[i],
          what + "is not Llama 3 scaling with low_freq_factor 1 (pair " + std::to_string(i) + ")");
}

// gpt-oss's YaRN as its converter writes it: factor, original_context_length and the two betas
// (HF's defaults 32 and 1 when absent). The HF attention factor 0.1 ln(factor) + 1 is implied;
// truncate is false, as every gpt-oss config.json says (a GGUF cannot say it). The yarn keys
// whose llama.cpp meaning differs from HF's are refused rather than read one way.
void read_yarn(const Meta& m, ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
  s.type = RopeScaling::Type::yarn;
  s.factor = m.positive_float("rope.scaling.factor", std::nullopt);
  if (!(s.factor >= 1.0f)) m.fail(m.key("rope.scaling.factor"), "must be at least 1 for yarn");
  s.original_max_position =
      m.positive_int_or("rope.scaling.original_context_length", c.max_position_embeddings);
  s.beta_fast = m.positive_float("rope.scaling.yarn_beta_fast", 32.0f);
  s.beta_slow = m.positive_float("rope.scaling.yarn_beta_slow", 1.0f);
  s.truncate = false;
  s.attention_factor = static_cast<float>(0.1 * std::log(static_cast<double>(s.factor)) + 1.0);
  for (const char* k : {"rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor",
                        "rope.scaling.yarn_log_multiplier"})
    if (m.g.metadata().count(m.key(k))) m.fail(m.key(k), "is not supported");
}

void read_rope_scaling(const Meta& m, float theta, ModelConfig& c) {
  const std::string type = m.g.get_string(m.key("rope.scaling.type")).value_or("none");
  const bool gpt_oss = m.arch == "gpt-oss";
  if (type == "linear") {
    c.rope_scaling.type = RopeScaling::Type::linear;
    c.rope_scaling.factor = m.positive_float("rope.scaling.factor", std::nullopt);
  } else if (type == "yarn" && gpt_oss) {
    read_yarn(m, c);
  } else if (type != "none") {
    m.fail(m.key("rope.scaling.type"), "'" + type + "' is not supported (supported: none, linear" +
                                           (gpt_oss ? ", yarn)" : ")"));
  }
  if (const GgufTensor* t = m.g.find("rope_freqs.weight")) {
    check(type == "none", m.g.path() + ": both rope.scaling.type '" + type +
                              "' and tensor 'rope_freqs.weight': expected one");
    read_llama3_factors(m, *t, theta, c);
  }
}

// Gemma 3: which layers attend within a sliding window. llama.cpp hard-codes a
// period of 6 (five local layers, then a global one) unless the file says otherwise,
// as an integer period or one bool per layer.
std::vector<bool> sliding_layers(const Meta& m, int layers) {
  std::vector<bool> sliding(static_cast<size_t>(layers));
  const std::string k = m.key("attention.sliding_window_pattern");
  const auto it = m.g.metadata().find(k);
  if (it != m.g.metadata().end() && it->second.type == GgufValue::Type::array) {
    const std::vector<double> flags = m.g.get_number_array(k);
    if (flags.size() != sliding.size())
      m.fail(k, "must hold one flag per layer (" + std::to_string(layers) + ")");
    for (size_t i = 0; i < flags.size(); ++i) sliding[i] = flags[i] != 0;
    return sliding;
  }
  const int pattern = m.positive_int_or("attention.sliding_window_pattern", 6);
  for (int i = 0; i < layers; ++i) sliding[i] = (i + 1) % pattern != 0;
  return sliding;
}

// The experts as llama.cpp reads them: expert_count, expert_used_count and
// expert_feed_forward_length (OLMoE's and GraniteMoE's converters write none: their experts
// are feed_forward_length wide); Qwen3-MoE's top-k weights renormalised unless
// expert_weights_norm says otherwise (llama.cpp hard-codes norm_w for qwen3moe, not for
// olmoe or qwen2moe); GraniteMoE's softmax over the top-k logits and its shared MLP
// (expert_shared_feed_forward_length); Qwen2-MoE's gated shared expert. A layer is MoE where
// its router blk.N.ffn_gate_inp is.
void read_experts(const Meta& m, ModelConfig& c) {
  MoeSpec& e = c.moe;
  const bool qwen = m.arch == "qwen3moe" || m.arch == "qwen2moe";
  e.num_experts = m.positive_int("expert_count");
  e.experts_per_token = m.positive_int("expert_used_count", e.num_experts);
  e.expert_intermediate_size =
      qwen ? m.positive_int("expert_feed_forward_length")
           : m.positive_int_or("expert_feed_forward_length", c.intermediate_size);
  e.norm_topk_prob =
      m.g.get_int(m.key("expert_weights_norm")).value_or(m.arch == "qwen3moe" ? 1 : 0) != 0;
  if (m.arch == "qwen2moe") {
    e.shared_intermediate_size = m.positive_int("expert_shared_feed_forward_length");
    e.shared_expert_gate = true;
  }
  if (m.arch == "granitemoe") {
    e.routing = MoeSpec::Routing::topk_then_softmax;
    if (m.g.get_int(m.key("expert_shared_feed_forward_length")))
      e.shared_intermediate_size = m.positive_int("expert_shared_feed_forward_length");
    if (e.shared_intermediate_size > 0) c.architecture = "GraniteMoeSharedForCausalLM";
  }
  for (int l = 0; l < c.num_layers; ++l)
    c.layers[l].moe = m.g.find("blk." + std::to_string(l) + ".ffn_gate_inp.weight") != nullptr;
}

// gpt-oss as llama.cpp runs it (LLM_ARCH_OPENAI_MOE): every layer's experts with biases, the
// top expert_used_count router logits softmaxed, the clamped SwiGLU, attention sinks, and a
// sliding window on the even layers (llama.cpp's hard-coded set_swa_pattern(2), which is
// also GptOssConfig's default layer_types).
void read_gpt_oss(const Meta& m, ModelConfig& c) {
  MoeSpec& e = c.moe;
  e.num_experts = m.positive_int("expert_count");
  e.experts_per_token = m.positive_int("expert_used_count", e.num_experts);
  e.expert_intermediate_size = m.positive_int("expert_feed_forward_length");
  e.routing = MoeSpec::Routing::topk_then_softmax;
  e.biases = true;
  c.hidden_act = Activation::swiglu_oai;
  c.attention_sinks = true;
  const int window = m.positive_int("attention.sliding_window");
  for (int l = 0; l < c.num_layers; ++l) {
    c.layers[l].moe = true;
    if (l % 2 == 0) c.layers[l].sliding_window = window;
  }
}

// Phi-3's LongRoPE as llama.cpp's converter stores it: rope_factors_short / _long tensors of
// rotary_dim / 2 F32 divisors, rope.scaling.original_context_length and attn_factor. The
// engine keeps the short factors with its context capped at the original (as from config.json).
void read_longrope(const Meta& m, ModelConfig& c) {
  const GgufTensor* shorts = m.g.find("rope_factors_short.weight");
  const GgufTensor* longs = m.g.find("rope_factors_long.weight");
  if (!shorts && !longs) return;
  const size_t pairs = static_cast<size_t>(c.rotary_dims() / 2);
  for (const GgufTensor* t : {shorts, longs}) {
    const std::string name = t == shorts ? "rope_factors_short.weight" : "rope_factors_long.weight";
    check(t != nullptr && t->type == GgmlType::F32 && t->dims.size() == 1 && t->dims[0] == pairs,
          m.g.path() + ": tensor '" + name + "' must be F32 with one factor per rotary pair (" +
              std::to_string(pairs) + ")");
  }
  RopeScaling& rs = c.rope_scaling;
  rs.type = RopeScaling::Type::longrope;
  rs.original_max_position = m.positive_int("rope.scaling.original_context_length");
  for (size_t i = 0; i < pairs; ++i) {
    float v;
    std::memcpy(&v, shorts->data + i * sizeof(float), sizeof(float));
    check(std::isfinite(v) && v > 0,
          m.g.path() + ": tensor 'rope_factors_short.weight' holds a factor not positive");
    rs.short_factor.push_back(v);
  }
  const double factor = static_cast<double>(c.max_position_embeddings) / rs.original_max_position;
  rs.factor = static_cast<float>(factor);
  const float computed =
      factor <= 1.0 ? 1.0f
                    : static_cast<float>(
                          std::sqrt(1.0 + std::log(factor) / std::log(rs.original_max_position)));
  rs.attention_factor = m.positive_float("rope.scaling.attn_factor", computed);
}

}  // namespace

const std::vector<std::string>& supported_gguf_architectures() {
  static const std::vector<std::string> kArchs = {
      "gemma3", "gpt-oss", "granite",  "granitemoe", "llama",    "olmo2",  "olmoe",
      "phi3",   "qwen2",   "qwen2moe", "qwen3",      "qwen3moe", "smollm3"};
  return kArchs;
}

ModelConfig model_config_from_gguf(const GgufFile& g) {
  const auto arch = g.get_string("general.architecture");
  check(arch.has_value(), g.path() + ": metadata 'general.architecture' is missing");
  const char* hf = hf_architecture(*arch);
  if (hf == nullptr) {
    std::string list;
    for (const auto& a : supported_gguf_architectures()) list += (list.empty() ? "" : ", ") + a;
    throw Error(g.path() + ": architecture '" + *arch +
                "' is not supported in a GGUF (supported: " + list + ")");
  }
  const Meta m{g, *arch};
  const bool gemma = *arch == "gemma3";

  ModelConfig c;
  c.architecture = hf;
  c.hidden_size = m.positive_int("embedding_length");
  c.intermediate_size = m.positive_int("feed_forward_length");
  c.num_layers = m.positive_int("block_count", kMaxLayers);
  c.num_heads = m.positive_int("attention.head_count");
  c.num_kv_heads = m.positive_int_or("attention.head_count_kv", c.num_heads);
  c.head_dim = m.positive_int_or("attention.key_length", c.hidden_size / c.num_heads);
  if (m.positive_int_or("attention.value_length", c.head_dim) != c.head_dim)
    m.fail(m.key("attention.value_length"), "must equal attention.key_length");
  const int rotary = m.positive_int_or("rope.dimension_count", c.head_dim);
  if (*arch == "phi3" && rotary <= c.head_dim && rotary % 2 == 0) {
    c.rotary_dim = rotary;  // Phi-3's partial rotary: the first dims of each head
  } else if (rotary != c.head_dim) {
    m.fail(m.key("rope.dimension_count"),
           "must equal the head size " + std::to_string(c.head_dim) +
               (*arch == "phi3" ? " or be an even number below it"
                                : " (partial rotary is not supported)"));
  }
  if (c.num_heads % c.num_kv_heads != 0)
    m.fail(m.key("attention.head_count_kv"), "(" + std::to_string(c.num_kv_heads) +
                                                 ") must divide attention.head_count (" +
                                                 std::to_string(c.num_heads) + ")");
  if (c.head_dim % 2 != 0) m.fail(m.key("attention.key_length"), "must be even for RoPE");

  // The rows the embedding holds, not the nominal vocabulary: ids past them have no row.
  const GgufTensor* embd = g.find("token_embd.weight");
  check(embd != nullptr && embd->dims.size() == 2,
        g.path() + ": tensor 'token_embd.weight' (a matrix) is missing");
  check(embd->dims[1] <= INT32_MAX, g.path() + ": tensor 'token_embd.weight' has too many rows");
  c.vocab_size = static_cast<int>(embd->dims[1]);
  c.max_position_embeddings = m.positive_int("context_length");
  c.rms_norm_eps = m.positive_float("attention.layer_norm_rms_epsilon", std::nullopt);
  c.tie_word_embeddings = g.find("output.weight") == nullptr;
  c.hidden_act = gemma ? Activation::gelu_tanh : Activation::silu;
  c.attention_bias = g.find("blk.0.attn_q.bias") != nullptr;
  apply_architecture_switches(c);
  c.attention_out_bias = g.find("blk.0.attn_output.bias") != nullptr;
  const float rope_theta = m.positive_float("rope.freq_base", 10000.0f);
  read_rope_scaling(m, rope_theta, c);
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{0, rope_theta, true});
  if (*arch == "granite" || *arch == "granitemoe") {  // llama.cpp's names for the multipliers
    c.embedding_scale = m.positive_float("embedding_scale", 1.0f);
    c.residual_scale = m.positive_float("residual_scale", 1.0f);
    c.query_scale = m.positive_float("attention.scale", c.query_scale);
    c.logit_divisor = m.positive_float("logit_scale", 1.0f);
  }
  if (*arch == "smollm3")  // llama.cpp hard-codes SmolLM3's NoPE layers: every 4th
    for (int i = 0; i < c.num_layers; ++i) c.layers[i].rope = (i + 1) % 4 != 0;
  if (*arch == "qwen3moe" || *arch == "qwen2moe" || *arch == "olmoe" || *arch == "granitemoe")
    read_experts(m, c);
  if (*arch == "gpt-oss") read_gpt_oss(m, c);
  if (*arch == "phi3") {
    read_longrope(m, c);
    // The converter writes HF's sliding_window (0 = none), which HF applies to every layer;
    // llama.cpp itself disables Phi-3's window (its PR 13676), the engine keeps HF's.
    if (m.g.get_int(m.key("attention.sliding_window")).value_or(0) != 0) {
      const int window = m.positive_int("attention.sliding_window");
      for (LayerSpec& l : c.layers) l.sliding_window = window;
    }
  }
  if (gemma) {
    // llama.cpp (LLM_ARCH_GEMMA3): 1/sqrt(head_dim), except 27B (62 layers): hidden/heads.
    const int scalar = c.num_layers == 62 ? c.hidden_size / c.num_heads : c.head_dim;
    c.query_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
    if (g.get_float(m.key("final_logit_softcapping")))
      c.final_logit_softcap = m.positive_float("final_logit_softcapping", std::nullopt);
    const int window = m.positive_int("attention.sliding_window");
    const float local_theta = m.positive_float("rope.freq_base_swa", 10000.0f);
    const std::vector<bool> sliding = sliding_layers(m, c.num_layers);
    for (int i = 0; i < c.num_layers; ++i)
      if (sliding[i]) c.layers[i] = LayerSpec{window, local_theta, false};
  }

  if (auto bos = m.token_id("tokenizer.ggml.bos_token_id", c.vocab_size)) c.bos_token_id = *bos;
  // Generation stops at every end the file declares: of the sequence, of a turn
  // (eot: Llama 3's <|eot_id|>), of a message (eom: its <|eom_id|>).
  for (const char* end : {"eos", "eot", "eom"})
    if (auto id = m.token_id(std::string("tokenizer.ggml.") + end + "_token_id", c.vocab_size);
        id && !c.is_eos(*id))
      c.eos_token_ids.push_back(*id);
  return c;
}

}  // namespace edgellm
