#include "models/gguf_config.h"

#include <cmath>
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
  return nullptr;
}

void read_rope_scaling(const Meta& m, ModelConfig& c) {
  const std::string type = m.g.get_string(m.key("rope.scaling.type")).value_or("none");
  if (type == "linear") {
    c.rope_scaling.type = RopeScaling::Type::linear;
    c.rope_scaling.factor = m.positive_float("rope.scaling.factor", std::nullopt);
  } else if (type != "none") {
    m.fail(m.key("rope.scaling.type"), "'" + type + "' is not supported (supported: none, linear)");
  }
  // llama.cpp stores Llama 3's frequency-dependent scaling as a tensor of
  // per-dimension factors instead of the parameters HF's config holds.
  check(m.g.find("rope_freqs.weight") == nullptr,
        m.g.path() +
            ": tensor 'rope_freqs.weight' (Llama 3.1 RoPE scaling) is not supported "
            "in a bare GGUF yet: run it from a converted checkpoint");
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

}  // namespace

const std::vector<std::string>& supported_gguf_architectures() {
  static const std::vector<std::string> kArchs = {"gemma3", "llama", "qwen2", "qwen3"};
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
  if (m.positive_int_or("rope.dimension_count", c.head_dim) != c.head_dim)
    m.fail(m.key("rope.dimension_count"), "must equal the head size " + std::to_string(c.head_dim) +
                                              " (partial rotary is not supported)");
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
  read_rope_scaling(m, c);

  const float rope_theta = m.positive_float("rope.freq_base", 10000.0f);
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{0, rope_theta, true});
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
  if (auto eos = m.token_id("tokenizer.ggml.eos_token_id", c.vocab_size))
    c.eos_token_ids.push_back(*eos);
  return c;
}

}  // namespace edgellm
