#include "models/gguf_weights.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "edgellm/bf16.h"
#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "models/gguf_config.h"

namespace edgellm {

namespace {

std::optional<kernels::BlockFormat> block_format(GgmlType t) {
  using kernels::BlockFormat;
  switch (t) {
    case GgmlType::Q4_0:
      return BlockFormat::q4_0;
    case GgmlType::Q4_1:
      return BlockFormat::q4_1;
    case GgmlType::Q5_0:
      return BlockFormat::q5_0;
    case GgmlType::Q5_1:
      return BlockFormat::q5_1;
    case GgmlType::Q8_0:
      return BlockFormat::q8_0;
    case GgmlType::Q2_K:
      return BlockFormat::q2_k;
    case GgmlType::Q3_K:
      return BlockFormat::q3_k;
    case GgmlType::Q4_K:
      return BlockFormat::q4_k;
    case GgmlType::Q5_K:
      return BlockFormat::q5_k;
    case GgmlType::Q6_K:
      return BlockFormat::q6_k;
    case GgmlType::IQ4_NL:
      return BlockFormat::iq4_nl;
    case GgmlType::IQ4_XS:
      return BlockFormat::iq4_xs;
    case GgmlType::MXFP4:
      return BlockFormat::mxfp4;
    default:
      return std::nullopt;
  }
}

bool is_float(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// The GGUF's own hyperparameters must be the ones config.json was written from.
void check_metadata(const GgufFile& g, const ModelConfig& c) {
  const auto arch = g.get_string("general.architecture");
  check(arch.has_value(), g.path() + ": metadata 'general.architecture' is missing");
  auto expect = [&](const std::string& key, int want, bool required) {
    const auto v = g.get_int(*arch + "." + key);
    check(v || !required, g.path() + ": metadata '" + *arch + "." + key + "' is missing");
    check(!v || *v == want, g.path() + ": metadata '" + *arch + "." + key + "' is " +
                                std::to_string(v.value_or(0)) + " but config.json says " +
                                std::to_string(want));
  };
  expect("block_count", c.num_layers, true);
  expect("embedding_length", c.hidden_size, true);
  expect("feed_forward_length", c.intermediate_size, true);
  expect("attention.head_count", c.num_heads, true);
  expect("attention.head_count_kv", c.num_kv_heads, false);
}

kernels::BlockFormat runnable_format(const std::string& file, const GgufTensor& t) {
  const auto format = block_format(t.type);
  check(format.has_value(), file + ": tensor '" + t.name + "' has type " +
                                ggml_type_name(static_cast<uint32_t>(t.type)) +
                                ", which edgellm cannot run (supported: Q4_0, Q4_1, Q5_0, Q5_1, "
                                "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, F16, "
                                "BF16, "
                                "F32)");
  return *format;
}

}  // namespace

std::vector<float> dequantize_gguf_tensor(const GgufTensor& t, size_t max_rows) {
  const size_t rows = max_rows ? std::min<size_t>(max_rows, t.rows()) : t.rows();
  kernels::QuantMatrix m;
  kernels::append_segment(
      m, kernels::repack_gguf(runnable_format("GGUF", t), t.data, rows, t.cols(), nullptr,
                              "GGUF tensor '" + t.name + "'"));
  std::vector<float> out(rows * t.cols());
  for (size_t r = 0; r < m.rows; ++r) kernels::dequant_row(m, r, out.data() + r * m.cols);
  return out;
}

std::unique_ptr<GgufWeights> open_gguf_weights(const std::filesystem::path& gguf_path,
                                               const ModelConfig& config) {
  auto w = std::make_unique<GgufWeights>(GgufWeights{GgufFile::open(gguf_path), {}, {}, {}});
  const GgufFile& g = w->file;
  check_metadata(g, config);

  const auto map_path = gguf_path.parent_path() / "gguf_map.json";
  check(std::filesystem::exists(map_path),
        map_path.string() + ": missing (scripts/fetch_model.py writes it beside model.gguf)");
  const nlohmann::json j = read_json_file(map_path);  // bounded nesting, errors name the byte
  const std::string where = map_path.string() + ": ";
  check(j.is_object() && j.contains("tensors") && j["tensors"].is_object(),
        where + "field 'tensors' is missing");
  for (const auto& [hf_name, entry] : j["tensors"].items()) {
    check(entry.is_object() && entry.contains("gguf") && entry["gguf"].is_string(),
          where + "tensors['" + hf_name + "'] needs a string field 'gguf'");
    const std::string name = entry["gguf"].get<std::string>();
    const GgufTensor* t = g.find(name);
    check(t != nullptr, g.path() + ": tensor '" + name + "' (for " + hf_name + ") is missing");
    check(t->dims.size() == 2, g.path() + ": tensor '" + name + "' has " +
                                   std::to_string(t->dims.size()) +
                                   " dimensions, a matrix needs 2");
    if (is_float(t->type)) continue;  // runs from the checkpoint's bf16 copy
    GgufMatrix m{.format = runnable_format(g.path(), *t),
                 .blocks = t->data,
                 .nbytes = t->nbytes,
                 .rows = t->rows(),
                 .cols = t->cols(),
                 .row_order = {}};
    if (entry.contains("row_order")) {
      const auto& order = entry["row_order"];
      check(order.is_array() && order.size() == m.rows, where + "tensors['" + hf_name +
                                                            "'].row_order must list " +
                                                            std::to_string(m.rows) + " rows");
      std::vector<bool> seen(m.rows, false);
      for (const auto& v : order) {
        check(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                  static_cast<uint64_t>(v.get<int64_t>()) < m.rows && !seen[v.get<size_t>()],
              where + "tensors['" + hf_name + "'].row_order is not a permutation of its rows");
        seen[v.get<size_t>()] = true;
        m.row_order.push_back(v.get<int32_t>());
      }
    }
    w->source.gguf.emplace(hf_name, std::move(m));
  }
  const auto* embd = w->source.gguf.find("model.embed_tokens.weight") != w->source.gguf.end()
                         ? &w->source.gguf.at("model.embed_tokens.weight")
                         : nullptr;
  check(!embd || embd->rows == static_cast<size_t>(config.vocab_size),
        g.path() + ": the embedding has " + std::to_string(embd ? embd->rows : 0) +
            " rows but config.json says vocab_size " + std::to_string(config.vocab_size));
  return w;
}

}  // namespace edgellm

namespace edgellm {

namespace {

// llama.cpp's tensor names (per layer "blk.N.<kind>") -> HF's, per architecture.
std::optional<std::string> hf_layer_kind(const std::string& arch, const std::string& kind) {
  static const std::map<std::string, std::string> kCommon = {
      {"attn_norm", "input_layernorm"},
      {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"},
      {"ffn_gate", "mlp.gate_proj"},
      {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
      {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate_inp", "mlp.gate"},  // a MoE layer's router
      // A shared MLP (GraniteMoeShared, Qwen2-MoE) under Qwen2-MoE's HF names
      {"ffn_gate_shexp", "mlp.shared_expert.gate_proj"},
      {"ffn_up_shexp", "mlp.shared_expert.up_proj"},
      {"ffn_down_shexp", "mlp.shared_expert.down_proj"},
      {"ffn_gate_inp_shexp", "mlp.shared_expert_gate"},  // Qwen2-MoE's [1, hidden] gate
  };
  static const std::map<std::string, std::string> kGemma = {
      {"ffn_norm", "pre_feedforward_layernorm"},
      {"post_attention_norm", "post_attention_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"},
  };
  static const std::map<std::string, std::string> kGptOss = {
      {"post_attention_norm", "post_attention_layernorm"},  // the norm before the experts
      {"ffn_gate_inp", "mlp.router"},
      {"attn_sinks", "self_attn.sinks"},
  };
  if (arch == "gpt-oss")
    if (auto it = kGptOss.find(kind); it != kGptOss.end()) return it->second;
  // Phi-3's fused projections: attn_qkv rows [q; k; v], ffn_up rows [gate; up].
  if (arch == "phi3" && kind == "attn_qkv") return "self_attn.qkv_proj";
  if (arch == "phi3" && kind == "ffn_up") return "mlp.gate_up_proj";
  if (auto it = kCommon.find(kind); it != kCommon.end()) return it->second;
  if (arch == "gemma3" || arch == "olmo2") {  // post-norms (OLMo 2 has no norm before the MLP)
    if (arch == "olmo2" && kind == "ffn_norm") return std::nullopt;
    if (auto it = kGemma.find(kind); it != kGemma.end()) return it->second;
  } else if (kind == "ffn_norm") {
    return "post_attention_layernorm";
  }
  return std::nullopt;
}

std::optional<std::string> hf_tensor_name(const std::string& arch, const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  const std::string base = name.substr(0, dot), suffix = name.substr(dot);
  if (suffix != ".weight" && suffix != ".bias") return std::nullopt;
  if (base == "token_embd") return "model.embed_tokens" + suffix;
  if (base == "output_norm") return "model.norm" + suffix;
  if (base == "output") return "lm_head" + suffix;
  if (!base.starts_with("blk.")) return std::nullopt;
  const size_t kind_at = base.find('.', 4);
  if (kind_at == std::string::npos || kind_at == 4) return std::nullopt;
  const std::string layer = base.substr(4, kind_at - 4);
  if (layer.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const auto kind = hf_layer_kind(arch, base.substr(kind_at + 1));
  if (!kind) return std::nullopt;
  // HF's sinks are a bare parameter (self_attn.sinks); the converter names it .weight.
  if (*kind == "self_attn.sinks") {
    if (suffix != ".weight") return std::nullopt;
    return "model.layers." + layer + "." + *kind;
  }
  return "model.layers." + layer + "." + *kind + suffix;
}

// llama.cpp stacks a MoE layer's experts into one 3-D tensor per projection,
// blk.N.ffn_{gate,up,down}_exps [n_expert][rows][cols], and gpt-oss's expert biases into one
// 2-D tensor, blk.N.ffn_{gate,up,down}_exps.bias [n_expert][rows]: the HF name of expert e's
// slice, or nullopt when `name` is not such a tensor.
std::optional<std::string> hf_expert_name(const std::string& name, size_t e) {
  static const std::pair<const char*, const char*> kExps[] = {{".ffn_gate_exps", "gate_proj"},
                                                              {".ffn_up_exps", "up_proj"},
                                                              {".ffn_down_exps", "down_proj"}};
  if (!name.starts_with("blk.")) return std::nullopt;
  const std::string suffix = name.ends_with(".bias") ? ".bias" : ".weight";
  if (!name.ends_with(suffix)) return std::nullopt;
  const std::string base = name.substr(0, name.size() - suffix.size());
  for (const auto& [kind, proj] : kExps) {
    if (!base.ends_with(kind)) continue;
    const std::string layer = base.substr(4, base.size() - 4 - std::strlen(kind));
    if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return "model.layers." + layer + ".mlp.experts." + std::to_string(e) + "." + proj + suffix;
  }
  return std::nullopt;
}

// llama.cpp's Llama converter reorders each Q/K head's rows for interleaved RoPE
// pairs (LlamaModel.permute), biases too (one value per row); HF's rotate_half
// wants them back: HF row (h, half, i) is GGUF row (h, i, half). Other
// architectures keep HF's order.
std::vector<int32_t> unpermute_order(const std::string& arch, const std::string& hf_name,
                                     size_t rows, const ModelConfig& c) {
  // Granite's, GraniteMoE's and SmolLM3's converters are the Llama converter's subclasses.
  if (arch != "llama" && arch != "granite" && arch != "granitemoe" && arch != "smollm3") return {};
  int heads = 0;
  if (hf_name.find(".self_attn.q_proj.") != std::string::npos) heads = c.num_heads;
  if (hf_name.find(".self_attn.k_proj.") != std::string::npos) heads = c.num_kv_heads;
  if (heads == 0) return {};
  const size_t want = static_cast<size_t>(heads) * static_cast<size_t>(c.head_dim);
  check(rows == want && c.head_dim % 2 == 0,
        hf_name + ": " + std::to_string(rows) + " rows, but the metadata's " +
            std::to_string(heads) + " heads of " + std::to_string(c.head_dim) + " need " +
            std::to_string(want) + " (in rotary pairs)");
  const size_t half = rows / heads / 2;
  std::vector<int32_t> order(rows);
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h)
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < half; ++i)
        order[(h * 2 + p) * half + i] = static_cast<int32_t>((h * half + i) * 2 + p);
  return order;
}

float float_element(const GgufTensor& t, size_t i) {
  uint16_t h;
  switch (t.type) {
    case GgmlType::F32: {
      float v;
      std::memcpy(&v, t.data + i * 4, 4);
      return v;
    }
    case GgmlType::F16:
      std::memcpy(&h, t.data + i * 2, 2);
      return f16_to_float(h);
    default:  // BF16
      std::memcpy(&h, t.data + i * 2, 2);
      return bf16_to_float(h);
  }
}

DType view_dtype(GgmlType t) {
  return t == GgmlType::F32 ? DType::f32 : t == GgmlType::F16 ? DType::f16 : DType::bf16;
}

}  // namespace

std::unique_ptr<GgufWeights> open_bare_gguf_weights(const std::filesystem::path& gguf_path) {
  auto w = std::make_unique<GgufWeights>(GgufWeights{GgufFile::open(gguf_path), {}, {}, {}});
  const GgufFile& g = w->file;
  const ModelConfig config = model_config_from_gguf(g);  // its head counts order Q/K rows
  const std::string arch = g.get_string("general.architecture").value_or("");
  std::map<std::string, TensorView> views;
  // One 1-D or 2-D tensor (or one expert's slice of a stacked one) under its HF name.
  const auto add = [&](const std::string& name, const GgufTensor& t, const std::string& hf) {
    TensorView v{.name = hf,
                 .dtype = DType::f32,
                 .shape = {},
                 .data = nullptr,
                 .nbytes = 0,
                 .file = g.path()};
    for (auto d = t.dims.rbegin(); d != t.dims.rend(); ++d)
      v.shape.push_back(static_cast<int64_t>(*d));
    // A vector (a bias) is reordered as a column: one value per row.
    const bool vector = t.dims.size() == 1;
    const size_t rows = vector ? t.numel() : t.rows(), cols = vector ? 1 : t.cols();
    std::vector<int32_t> order = unpermute_order(arch, hf, rows, config);
    if (!is_float(t.type)) {
      check(t.dims.size() == 2, g.path() + ": tensor '" + name + "' is quantized but not a matrix");
      w->source.gguf.emplace(hf, GgufMatrix{.format = runnable_format(g.path(), t),
                                            .blocks = t.data,
                                            .nbytes = t.nbytes,
                                            .rows = t.rows(),
                                            .cols = t.cols(),
                                            .row_order = std::move(order)});
    } else {
      // HF's Gemma norms hold w where llama.cpp stores 1 + w; subtracting in fp32, as the
      // converter does, keeps this path bit-identical to the converted fp32 checkpoint.
      const bool minus_one = arch == "gemma3" && name.ends_with("norm.weight");
      if (order.empty() && !minus_one) {
        v.dtype = view_dtype(t.type);
        v.data = t.data;
        v.nbytes = t.nbytes;
      } else {
        std::vector<float>& out = w->owned.emplace_back(t.numel());
        for (size_t r = 0; r < rows; ++r) {
          const size_t src = order.empty() ? r : static_cast<size_t>(order[r]);
          for (size_t i = 0; i < cols; ++i) {
            const float x = float_element(t, src * cols + i);
            out[r * cols + i] = minus_one ? x - 1.0f : x;
          }
        }
        v.data = out.data();
        v.nbytes = out.size() * sizeof(float);
      }
    }
    views.emplace(hf, std::move(v));
  };
  for (const auto& [name, t] : g.tensors()) {
    if (name == "rope_freqs.weight") continue;  // Llama 3 RoPE scaling: read into the config
    if (arch == "phi3" &&
        (name == "rope_factors_short.weight" || name == "rope_factors_long.weight"))
      continue;  // LongRoPE: read into the config
    if (hf_expert_name(name, 0)) {
      // Each expert is a view of its rows of the mapping, nothing copied.
      const bool bias = name.ends_with(".bias");
      const size_t rank = bias ? 2 : 3;
      check(t.dims.size() == rank && t.dims.back() > 0 && t.nbytes % t.dims.back() == 0,
            g.path() + ": tensor '" + name + "' must be " +
                (bias ? "2-D [experts][rows]" : "3-D [experts][rows][cols]"));
      const size_t experts = t.dims.back(), bytes = t.nbytes / experts;
      for (size_t e = 0; e < experts; ++e) {
        GgufTensor slice = t;
        slice.dims.pop_back();
        slice.data = t.data + e * bytes;
        slice.nbytes = bytes;
        const std::string hf = *hf_expert_name(name, e);
        add(name, slice, hf);
      }
      continue;
    }
    const auto hf = hf_tensor_name(arch, name);
    check(hf.has_value(),
          g.path() + ": tensor '" + name + "' is not one edgellm knows for a " + arch + " model");
    check(t.dims.size() == 1 || t.dims.size() == 2, g.path() + ": tensor '" + name + "' has " +
                                                        std::to_string(t.dims.size()) +
                                                        " dimensions, expected 1 or 2");
    add(name, t, *hf);
  }
  w->checkpoint = Checkpoint::from_views(std::move(views));
  return w;
}

}  // namespace edgellm
