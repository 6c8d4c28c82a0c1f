#include "models/weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "edgellm/bf16.h"
#include "edgellm/error.h"
#include "io/mapped_file.h"

namespace edgellm {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

class TensorSource {
 public:
  explicit TensorSource(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  const TensorView* optional(const std::string& name, std::vector<int64_t> shape) const {
    const TensorView* t = ckpt_.find(name);
    if (!t) return nullptr;
    check(t->shape == shape, t->file + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                                 " but config.json implies " + shape_str(shape));
    return t;
  }
  const TensorView& required(const std::string& name, std::vector<int64_t> shape) const {
    const TensorView* t = optional(name, shape);
    check(t != nullptr,
          "checkpoint: tensor '" + name + "' is missing (expected shape " + shape_str(shape) + ")");
    return *t;
  }

 private:
  const Checkpoint& ckpt_;
};

// Element i's raw bits. safetensors does not align tensor data (an odd header
// length shifts every tensor), so loads go through memcpy, never a typed pointer.
template <typename T>
T load(const TensorView& t, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.data) + i * sizeof(T), sizeof(T));
  return v;
}

float element(const TensorView& t, size_t i) {
  switch (t.dtype) {
    case DType::bf16:
      return bf16_to_float(load<uint16_t>(t, i));
    case DType::f16:
      return f16_to_float(load<uint16_t>(t, i));
    case DType::f32:
      return load<float>(t, i);
  }
  return 0.0f;
}

// Appends a tensor's values as bf16 (the engine's weight dtype), rejecting
// non-finite values: safetensors has no checksum, and a flipped exponent bit
// in a corrupted file usually shows up as inf/NaN.
// Elements [first, first + n) of the tensor. Returns whether rounding to bf16
// changed a value (an f32 or f16 file whose values are not all bf16 ones).
bool append_bf16(const TensorView& t, size_t first, size_t n, std::vector<uint16_t>& out) {
  const size_t base = out.size();
  out.resize(base + n);
  bool rounded = false;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = first + k;
    const float v = element(t, i);
    if (!std::isfinite(v))  // not check(): the message must not be built per element
      throw Error(t.file + ": tensor '" + t.name + "' holds a non-finite value at index " +
                  std::to_string(i) + " (corrupt file?)");
    out[base + k] = t.dtype == DType::bf16 ? load<uint16_t>(t, i) : float_to_bf16(v);
    rounded |= bf16_to_float(out[base + k]) != v;
  }
  return rounded;
}
bool append_bf16(const TensorView& t, std::vector<uint16_t>& out) {
  return append_bf16(t, 0, static_cast<size_t>(t.numel()), out);
}

// What packing produced: bytes, and the dtype of a matrix whose values were
// rounded to bf16 (null when every value was held as stored).
struct PackStats {
  size_t bytes = 0;
  const char* rounded_from = nullptr;
};

std::vector<float> to_float(const TensorView& t, float add) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = element(t, i) + add;
    if (!std::isfinite(out[i]))
      throw Error(t.file + ": tensor '" + t.name + "' holds a non-finite value");
  }
  return out;
}

// The quantized matrix for `parts` (stacked rows), or null when the matrices
// stay bf16: GGUF blocks when the source maps every part, else quantized at
// setup when asked.
std::shared_ptr<const kernels::QuantMatrix> pack_quant(
    const QuantSource* quant, std::initializer_list<const TensorView*> parts) {
  if (!quant) return nullptr;
  auto m = std::make_shared<kernels::QuantMatrix>();
  for (const TensorView* t : parts) {
    const auto rows = static_cast<size_t>(t->shape[0]), cols = static_cast<size_t>(t->shape[1]);
    if (auto it = quant->gguf.find(t->name); it != quant->gguf.end()) {
      const GgufMatrix& g = it->second;
      check(g.rows == rows && g.cols == cols,
            "GGUF tensor for '" + t->name + "' is " + std::to_string(g.rows) + " x " +
                std::to_string(g.cols) + ", the checkpoint's is " + std::to_string(rows) + " x " +
                std::to_string(cols));
      kernels::append_segment(
          *m, kernels::repack_gguf(g.format, g.blocks, rows, cols,
                                   g.row_order.empty() ? nullptr : g.row_order.data(),
                                   "GGUF tensor for '" + t->name + "'"));
      release_mapped_pages(g.blocks, g.nbytes);  // peak memory: the repacked copy only
    } else if (quant->quantize && cols % 32 == 0) {
      // The checkpoint's values as the bf16 path holds them, quantized a slice of
      // rows at a time: setup's peak is then the blocks and their repacked copy,
      // not an fp32 copy of the whole matrix (1 GB for a 128k x 2048 embedding).
      const kernels::BlockFormat f = *quant->quantize;
      const size_t row_bytes = cols / 32 * kernels::block_bytes(f);
      std::vector<uint8_t> blocks(rows * row_bytes);
      std::vector<uint16_t> bf16;
      std::vector<float> x;
      constexpr size_t kSliceElems = size_t{1} << 20;
      const size_t slice = std::max<size_t>(1, kSliceElems / cols);
      for (size_t r0 = 0; r0 < rows; r0 += slice) {
        const size_t n = std::min(slice, rows - r0);
        bf16.clear();
        append_bf16(*t, r0 * cols, n * cols, bf16);
        x.resize(bf16.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(bf16[i]);
        kernels::quantize_blocks(f, x.data(), n, cols, blocks.data() + r0 * row_bytes);
      }
      kernels::append_segment(*m, kernels::repack_gguf(f, blocks.data(), rows, cols));
    } else {
      check(m->segments.empty(), "checkpoint: tensor '" + t->name +
                                     "' has no quantized form but the tensors fused with it do");
      return nullptr;
    }
  }
  return m;
}

kernels::PackedMatrix pack(const QuantSource* quant, std::initializer_list<const TensorView*> parts,
                           PackStats& stats, kernels::Isa isa) {
  if (auto q = pack_quant(quant, parts)) {
    kernels::PackedMatrix m = kernels::pack_quant(std::move(q), isa);
    stats.bytes += m.byte_size();
    for (const TensorView* t : parts) t->release_pages();
    return m;
  }
  std::vector<uint16_t> rows;
  size_t n_rows = 0, cols = static_cast<size_t>(parts.begin()[0]->shape[1]);
  for (const TensorView* t : parts) {
    if (append_bf16(*t, rows)) stats.rounded_from = dtype_name(t->dtype);
    n_rows += static_cast<size_t>(t->shape[0]);
  }
  for (const TensorView* t : parts) t->release_pages();
  kernels::PackedMatrix m = kernels::pack_matrix(rows.data(), n_rows, cols, isa);
  stats.bytes += m.byte_size();
  return m;
}

// One layer's checkpoint tensors, looked up and shape-checked (no data read).
struct ExpertTensors {
  const TensorView *gate, *up, *down;
  const TensorView *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;  // gpt-oss
};
// gpt-oss's experts as transformers stores them, all experts in one tensor each:
// gate_up_proj [E, hidden, 2 X] multiplied as x @ W, gate and up interleaved along its last
// axis (gate = [..., ::2], up = [..., 1::2]); down_proj [E, X, hidden], also x @ W.
struct StackedExperts {
  const TensorView *gate_up = nullptr, *gate_up_bias = nullptr;  // [E, H, 2X], [E, 2X]
  const TensorView *down = nullptr, *down_bias = nullptr;        // [E, X, H], [E, H]
};
struct LayerTensors {
  const TensorView *attn_norm = nullptr, *ffn_norm = nullptr;  // pre_norms only
  const TensorView *q = nullptr, *k = nullptr, *v = nullptr, *o;
  const TensorView* qkv = nullptr;  // fused_projections (Phi-3) instead of q, k, v
  const TensorView *gate = nullptr, *up = nullptr, *down = nullptr;  // dense layers
  const TensorView* gate_up = nullptr;      // fused_projections instead of gate, up
  const TensorView* router = nullptr;       // MoE layers
  const TensorView* router_bias = nullptr;  // MoeSpec::biases
  const TensorView* shared_gate = nullptr;  // MoeSpec::shared_expert_gate
  const TensorView* sinks = nullptr;        // attention_sinks
  std::vector<ExpertTensors> experts;       // one per expert, or
  StackedExperts oss_stacked;               // gpt-oss's HF layout (oss_stacked.gate_up set)
  // GraniteMoE's stacked tensors (MoeSpec::stacked_experts), read through the row slices
  // below: the experts' gate / up / down, the shared MLP's gate / up.
  std::vector<const TensorView*> stacked;
  std::vector<std::unique_ptr<const TensorView>> slices;
  const TensorView *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;  // attention_bias
  const TensorView* o_bias = nullptr;                                        // attention_out_bias
  const TensorView *q_norm = nullptr, *k_norm = nullptr;                     // qk_norm
  const TensorView *post_attn_norm = nullptr, *post_ffn_norm = nullptr;      // Gemma sandwich
};

// gpt-oss's router (mlp.router, with a bias) and experts: HF's stacked tensors, or (a GGUF file's
// experts, sliced per expert by models/gguf_weights.cpp) mlp.experts.<e>.{gate,up,down}_proj
// weights and biases.
LayerTensors find_gpt_oss_experts(const TensorSource& src, const ModelConfig& c,
                                  const std::string& p, LayerTensors t) {
  const int64_t H = c.hidden_size, E = c.moe.num_experts, X = c.moe.expert_intermediate_size;
  auto req = [&](const std::string& name, std::vector<int64_t> shape) {
    return &src.required(p + name, std::move(shape));
  };
  t.router = req("mlp.router.weight", {E, H});
  t.router_bias = req("mlp.router.bias", {E});
  if (const TensorView* gate_up = src.optional(p + "mlp.experts.gate_up_proj", {E, H, 2 * X})) {
    t.oss_stacked = {gate_up, req("mlp.experts.gate_up_proj_bias", {E, 2 * X}),
                     req("mlp.experts.down_proj", {E, X, H}),
                     req("mlp.experts.down_proj_bias", {E, H})};
    return t;
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = "mlp.experts." + std::to_string(e) + ".";
    t.experts.push_back({req(x + "gate_proj.weight", {X, H}), req(x + "up_proj.weight", {X, H}),
                         req(x + "down_proj.weight", {H, X}), req(x + "gate_proj.bias", {X}),
                         req(x + "up_proj.bias", {X}), req(x + "down_proj.bias", {H})});
  }
  return t;
}

// Rows [first, first + count) of matrix `index` of a tensor of matrices ([N, rows, cols];
// [rows, cols] with index 0): a view into the same mapping, named for errors.
const TensorView* slice_rows(LayerTensors& t, const TensorView& m, int64_t index, int64_t first,
                             int64_t count) {
  const int64_t rows = m.shape[m.shape.size() - 2], cols = m.shape.back();
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(m.dtype);
  auto v = std::make_unique<TensorView>(m);
  v->name = m.name + "[" + std::to_string(index) + "][" + std::to_string(first) + ":" +
            std::to_string(first + count) + "]";
  v->shape = {count, cols};
  v->data = static_cast<const uint8_t*>(m.data) + (index * rows + first) * row_bytes;
  v->nbytes = static_cast<size_t>(count) * row_bytes;
  return t.slices.emplace_back(std::move(v)).get();
}

// A MoE layer's router, experts and shared MLP (the dense fields gate / up / down).
void find_moe(const TensorSource& src, const ModelConfig& c, const std::string& p,
              LayerTensors& t) {
  const int64_t H = c.hidden_size, E = c.moe.num_experts, X = c.moe.expert_intermediate_size;
  const int64_t S = c.moe.shared_intermediate_size;
  auto req = [&](const std::string& name, std::vector<int64_t> shape) {
    return &src.required(p + name, std::move(shape));
  };
  if (!c.moe.stacked_experts) {
    t.router = req("mlp.gate.weight", {E, H});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = "mlp.experts." + std::to_string(e) + ".";
      t.experts.push_back({req(x + "gate_proj.weight", {X, H}), req(x + "up_proj.weight", {X, H}),
                           req(x + "down_proj.weight", {H, X})});
    }
    if (S > 0) {
      t.gate = req("mlp.shared_expert.gate_proj.weight", {S, H});
      t.up = req("mlp.shared_expert.up_proj.weight", {S, H});
      t.down = req("mlp.shared_expert.down_proj.weight", {H, S});
    }
    if (c.moe.shared_expert_gate) t.shared_gate = req("mlp.shared_expert_gate.weight", {1, H});
    return;
  }
  // HF GraniteMoeMoE: input_linear's rows per expert are [gate; up] (chunk(2) -> act(gate) * up).
  t.router = req("block_sparse_moe.router.layer.weight", {E, H});
  const TensorView* in = req("block_sparse_moe.input_linear.weight", {E, 2 * X, H});
  const TensorView* out = req("block_sparse_moe.output_linear.weight", {E, H, X});
  t.stacked = {in, out};
  for (int64_t e = 0; e < E; ++e)
    t.experts.push_back(
        {slice_rows(t, *in, e, 0, X), slice_rows(t, *in, e, X, X), slice_rows(t, *out, e, 0, H)});
  if (S > 0) {
    const TensorView* shared_in = req("shared_mlp.input_linear.weight", {2 * S, H});
    t.stacked.push_back(shared_in);
    t.gate = slice_rows(t, *shared_in, 0, 0, S);
    t.up = slice_rows(t, *shared_in, 0, S, S);
    t.down = req("shared_mlp.output_linear.weight", {H, S});
  }
}

LayerTensors find_layer(const TensorSource& src, const ModelConfig& c, int l) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_rows = c.num_heads * D, kv_rows = c.num_kv_heads * D;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto req = [&](const std::string& name, std::vector<int64_t> shape) {
    return &src.required(p + name, std::move(shape));
  };
  LayerTensors t;
  if (c.pre_norms) t.attn_norm = req("input_layernorm.weight", {H});
  if (c.fused_projections) {  // rows [q; k; v], the order the engine packs them in
    t.qkv = req("self_attn.qkv_proj.weight", {q_rows + 2 * kv_rows, H});
  } else {
    t.q = req("self_attn.q_proj.weight", {q_rows, H});
    t.k = req("self_attn.k_proj.weight", {kv_rows, H});
    t.v = req("self_attn.v_proj.weight", {kv_rows, H});
  }
  t.o = req("self_attn.o_proj.weight", {H, q_rows});
  if (c.attention_bias) {
    t.q_bias = req("self_attn.q_proj.bias", {q_rows});
    t.k_bias = req("self_attn.k_proj.bias", {kv_rows});
    t.v_bias = req("self_attn.v_proj.bias", {kv_rows});
  }
  if (c.attention_out_bias) t.o_bias = req("self_attn.o_proj.bias", {H});
  if (c.qk_norm) {
    t.q_norm = req("self_attn.q_norm.weight", {c.qk_norm_whole ? q_rows : D});
    t.k_norm = req("self_attn.k_norm.weight", {c.qk_norm_whole ? kv_rows : D});
  }
  if (c.sandwich_norms) {
    // Gemma 3 / OLMo 2: post_attention_layernorm follows attention; Gemma's
    // pre_feedforward_layernorm precedes the MLP.
    t.post_attn_norm = req("post_attention_layernorm.weight", {H});
    if (c.pre_norms) t.ffn_norm = req("pre_feedforward_layernorm.weight", {H});
    t.post_ffn_norm = req("post_feedforward_layernorm.weight", {H});
  } else {
    // Llama family: post_attention_layernorm is the norm before the MLP.
    t.ffn_norm = req("post_attention_layernorm.weight", {H});
  }
  if (c.attention_sinks) t.sinks = req("self_attn.sinks", {c.num_heads});
  if (c.layers[l].moe && c.moe.biases) return find_gpt_oss_experts(src, c, p, std::move(t));
  if (c.layers[l].moe) {
    find_moe(src, c, p, t);
    return t;
  }
  if (c.fused_projections) {  // rows [gate; up] (HF Phi3MLP: gate, up = chunk(2))
    t.gate_up = req("mlp.gate_up_proj.weight", {2 * I, H});
  } else {
    t.gate = req("mlp.gate_proj.weight", {I, H});
    t.up = req("mlp.up_proj.weight", {I, H});
  }
  t.down = req("mlp.down_proj.weight", {H, I});
  return t;
}

// Every tensor the config names, found and shape-checked before anything sized
// by the config is allocated: a config claiming more layers, or a larger vocab,
// than the checkpoint holds fails on the first tensor that disagrees.
struct WeightPlan {
  const TensorView* embed;
  std::vector<LayerTensors> layers;
  const TensorView* final_norm;
  const TensorView* lm_head;  // the embedding when tied
  size_t bytes = 0;           // what load_weights will allocate
};

// Why the config has no place for `name` (the flag that would make one), or "".
std::string missing_switch(const std::string& name, const ModelConfig& c) {
  if (name.ends_with("_proj.bias")) return " (attention_bias is false)";
  if (name.find("q_norm.") != std::string::npos || name.find("k_norm.") != std::string::npos)
    return " (it has no QK-norm)";
  if (name.find("feedforward_layernorm.") != std::string::npos)
    return " (it has no sandwich norms)";
  if (name.starts_with("model.layers."))
    return " (num_hidden_layers is " + std::to_string(c.num_layers) + ")";
  return "";
}

// A tensor the plan leaves unread is a file that does not fit its declared
// architecture (a Qwen2 file declared as Llama loses its q/k/v bias): refused,
// never silently run without it. Old checkpoints' RoPE buffers are not weights.
void check_all_planned(const Checkpoint& ckpt, const ModelConfig& c,
                       const std::set<const TensorView*>& planned) {
  for (const auto& [name, t] : ckpt.tensors()) {
    if (planned.contains(&t) || name.ends_with(".rotary_emb.inv_freq")) continue;
    throw Error(t.file + ": tensor '" + name + "' is unexpected for " + c.architecture +
                missing_switch(name, c) + ": the file does not fit its declared architecture");
  }
}

WeightPlan plan_weights(const Checkpoint& ckpt, const ModelConfig& c,
                        const QuantSource* quant = nullptr) {
  TensorSource src(ckpt);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  WeightPlan plan;
  plan.embed = &src.required("model.embed_tokens.weight", {V, H});
  for (int l = 0; l < c.num_layers; ++l) plan.layers.push_back(find_layer(src, c, l));
  plan.final_norm = &src.required("model.norm.weight", {H});
  const TensorView* head = src.optional("lm_head.weight", {V, H});
  check(head || c.tie_word_embeddings,
        "checkpoint: tensor 'lm_head.weight' is missing and config.json does not tie word "
        "embeddings");
  plan.lm_head = head && !c.tie_word_embeddings ? head : plan.embed;
  std::set<const TensorView*> planned = {plan.embed, plan.final_norm, head};
  // Matrices become bf16 or their quantized form (gpt-oss's stacked experts: bf16),
  // vectors fp32; an untied embedding is copied too.
  auto add = [&](const TensorView* t, bool quantized_at_setup = true) {
    if (!t) return;
    const bool matrix = t->shape.size() == 2;
    const auto rows = matrix ? static_cast<size_t>(t->shape[0]) : 0;
    const auto cols = matrix ? static_cast<size_t>(t->shape[1]) : 0;
    if (const auto g = quant ? quant->gguf.find(t->name) : decltype(quant->gguf)::const_iterator{};
        quant && g != quant->gguf.end())
      plan.bytes += kernels::repacked_bytes(g->second.format, g->second.rows, g->second.cols);
    else if (matrix && quant && quant->quantize && quantized_at_setup && cols % 32 == 0)
      plan.bytes += kernels::repacked_bytes(*quant->quantize, rows, cols);
    else
      plan.bytes += static_cast<size_t>(t->numel()) * (t->shape.size() >= 2 ? 2 : 4);
  };
  for (const LayerTensors& t : plan.layers)
    for (const TensorView* v : {t.attn_norm,
                                t.q,
                                t.k,
                                t.v,
                                t.qkv,
                                t.o,
                                t.ffn_norm,
                                t.gate,
                                t.up,
                                t.gate_up,
                                t.down,
                                t.q_bias,
                                t.k_bias,
                                t.v_bias,
                                t.o_bias,
                                t.q_norm,
                                t.k_norm,
                                t.post_attn_norm,
                                t.post_ffn_norm,
                                t.router,
                                t.router_bias,
                                t.shared_gate,
                                t.sinks,
                                t.oss_stacked.gate_up,
                                t.oss_stacked.gate_up_bias,
                                t.oss_stacked.down,
                                t.oss_stacked.down_bias}) {
      add(v);
      planned.insert(v);
    }
  for (const LayerTensors& t : plan.layers) {
    planned.insert(t.stacked.begin(), t.stacked.end());  // read through their slices
    for (const ExpertTensors& x : t.experts)
      for (const TensorView* v : {x.gate, x.up, x.down, x.gate_bias, x.up_bias, x.down_bias}) {
        add(v);
        planned.insert(v);
      }
  }
  check_all_planned(ckpt, c, planned);
  add(plan.final_norm);
  add(plan.lm_head);
  if (plan.lm_head != plan.embed) add(plan.embed, false);  // --weights leaves it bf16
  return plan;
}

// Rows [out][in] of the x @ W matrices of one expert of a stacked tensor [E][in][cols]: output
// row r is column col(r) (`rows` of them), transposed into the engine's W[r][c] layout, kept in
// the file's dtype (pack() then rounds and checks it as any tensor). nbytes 0: the copy is
// heap memory, which release_pages must not drop.
struct TransposedExpert {
  std::vector<uint8_t> bytes;
  TensorView view;
};
template <typename Col>
TransposedExpert transpose_expert(const TensorView& t, int64_t e, int64_t rows, Col col) {
  const size_t in = static_cast<size_t>(t.shape[1]), cols = static_cast<size_t>(t.shape[2]);
  const size_t elem = dtype_size(t.dtype);
  TransposedExpert x;
  x.bytes.resize(static_cast<size_t>(rows) * in * elem);
  const auto* src = static_cast<const uint8_t*>(t.data) + static_cast<size_t>(e) * in * cols * elem;
  for (size_t r = 0; r < static_cast<size_t>(rows); ++r)
    for (size_t i = 0; i < in; ++i)
      std::memcpy(&x.bytes[(r * in + i) * elem], src + (i * cols + col(r)) * elem, elem);
  x.view = {t.name + "[" + std::to_string(e) + "]",
            t.dtype,
            {rows, static_cast<int64_t>(in)},
            x.bytes.data(),
            0,
            t.file};
  return x;
}

// gpt-oss's stacked experts (StackedExperts) packed per expert as the engine's fused
// [gate; up] rows, de-interleaved (gate = even columns, up = odd ones), and down rows,
// each with its bias in the same order.
void unstack_experts(const StackedExperts& s, const ModelConfig& c, const QuantSource* quant,
                     kernels::Isa isa, PackStats& stats, LayerWeights& L) {
  const size_t X = static_cast<size_t>(c.moe.expert_intermediate_size);
  const size_t H = static_cast<size_t>(c.hidden_size);
  const std::vector<float> gate_up_bias = to_float(*s.gate_up_bias, 0.0f);
  const std::vector<float> down_bias = to_float(*s.down_bias, 0.0f);
  // Fused row r: gate row r (column 2r) for r < X, else up row r - X (column 2(r - X) + 1).
  const auto fused_column = [X](size_t r) { return r < X ? 2 * r : 2 * (r - X) + 1; };
  for (int64_t e = 0; e < c.moe.num_experts; ++e) {
    const size_t ue = static_cast<size_t>(e);
    const TransposedExpert gate_up =
        transpose_expert(*s.gate_up, e, static_cast<int64_t>(2 * X), fused_column);
    L.expert_gate_up.push_back(pack(quant, {&gate_up.view}, stats, isa));
    std::vector<float> bias(2 * X);
    for (size_t r = 0; r < 2 * X; ++r) bias[r] = gate_up_bias[ue * 2 * X + fused_column(r)];
    L.expert_gate_up.back().bias = kernels::Bias(std::move(bias));
    const TransposedExpert down =
        transpose_expert(*s.down, e, static_cast<int64_t>(H), [](size_t r) { return r; });
    L.expert_down.push_back(pack(quant, {&down.view}, stats, isa));
    L.expert_down.back().bias = kernels::Bias(
        std::vector<float>(down_bias.begin() + static_cast<std::ptrdiff_t>(ue * H),
                           down_bias.begin() + static_cast<std::ptrdiff_t>((ue + 1) * H)));
  }
  for (const TensorView* t : {s.gate_up, s.down}) t->release_pages();
}

// One layer's tensors, checked and packed. Layers are independent, so setup
// packs them in parallel (validation and packing dominate setup time).
LayerWeights load_layer(const LayerTensors& t, const ModelConfig& c, const QuantSource* quant,
                        kernels::Isa isa, PackStats& stats) {
  const float norm_add = c.norm_adds_one ? 1.0f : 0.0f;  // Gemma stores w, applies (1 + w)
  LayerWeights L;
  if (c.pre_norms) L.attn_norm = to_float(*t.attn_norm, norm_add);
  L.qkv = c.fused_projections ? pack(quant, {t.qkv}, stats, isa)
                              : pack(quant, {t.q, t.k, t.v}, stats, isa);
  if (c.attention_bias) {
    std::vector<float> bias;
    for (const TensorView* b : {t.q_bias, t.k_bias, t.v_bias}) {
      auto v = to_float(*b, 0.0f);
      bias.insert(bias.end(), v.begin(), v.end());
    }
    L.qkv.bias = kernels::Bias(std::move(bias));
  }
  if (c.qk_norm) {
    L.q_norm = to_float(*t.q_norm, norm_add);
    L.k_norm = to_float(*t.k_norm, norm_add);
  }
  L.o_proj = pack(quant, {t.o}, stats, isa);
  if (c.attention_out_bias) L.o_proj.bias = kernels::Bias(to_float(*t.o_bias, 0.0f));
  if (c.sandwich_norms) {
    L.post_attn_norm = to_float(*t.post_attn_norm, norm_add);
    L.post_ffn_norm = to_float(*t.post_ffn_norm, norm_add);
  }
  if (c.pre_norms) L.ffn_norm = to_float(*t.ffn_norm, norm_add);
  if (t.sinks) L.sinks = to_float(*t.sinks, 0.0f);
  if (t.router) {
    L.router = pack(quant, {t.router}, stats, isa);
    if (t.router_bias) L.router.bias = kernels::Bias(to_float(*t.router_bias, 0.0f));
    PackStats experts;
    if (t.oss_stacked.gate_up) {
      unstack_experts(t.oss_stacked, c, quant, isa, experts, L);
    }
    for (const ExpertTensors& x : t.experts) {
      L.expert_gate_up.push_back(pack(quant, {x.gate, x.up}, experts, isa));
      L.expert_down.push_back(pack(quant, {x.down}, experts, isa));
      if (x.gate_bias) {
        std::vector<float> bias = to_float(*x.gate_bias, 0.0f), up = to_float(*x.up_bias, 0.0f);
        bias.insert(bias.end(), up.begin(), up.end());
        L.expert_gate_up.back().bias = kernels::Bias(std::move(bias));
        L.expert_down.back().bias = kernels::Bias(to_float(*x.down_bias, 0.0f));
      }
    }
    // A decode step reads only the experts_per_token experts of its token (all of one size).
    stats.bytes +=
        experts.bytes / L.expert_down.size() * static_cast<size_t>(c.moe.experts_per_token);
    if (experts.rounded_from) stats.rounded_from = experts.rounded_from;
    if (t.gate) {  // the shared MLP, which every token runs
      L.gate_up = pack(quant, {t.gate, t.up}, stats, isa);
      L.down = pack(quant, {t.down}, stats, isa);
    }
    if (t.shared_gate) L.shared_expert_gate = pack(quant, {t.shared_gate}, stats, isa);
    return L;
  }
  L.gate_up = c.fused_projections ? pack(quant, {t.gate_up}, stats, isa)
                                  : pack(quant, {t.gate, t.up}, stats, isa);
  L.down = pack(quant, {t.down}, stats, isa);
  return L;
}

}  // namespace

size_t check_weights(const Checkpoint& ckpt, const ModelConfig& config, const QuantSource* quant) {
  return plan_weights(ckpt, config, quant).bytes;
}

void ModelWeights::embed_row(size_t token, float* out) const {
  if (embed_quant.quant) return kernels::unpack_row(embed_quant, token, out);  // GGUF table
  if (embed.empty()) return kernels::unpack_row(lm_head, token, out);          // tied
  const size_t H = lm_head.cols;
  for (size_t i = 0; i < H; ++i) out[i] = bf16_to_float(embed[token * H + i]);
}

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, ThreadPool* pool,
                          const QuantSource* quant, kernels::Isa isa) {
  const WeightPlan plan = plan_weights(ckpt, c);
  ModelWeights w;
  const float norm_add = c.norm_adds_one ? 1.0f : 0.0f;  // Gemma stores w, applies (1 + w)
  if (quant && quant->gguf.count(plan.embed->name)) {  // lookups dequantize rows of the GGUF table
    PackStats table;  // a lookup reads one row per token, not the table: not decode bytes
    w.embed_quant = pack(quant, {plan.embed}, table, isa);
  }

  std::vector<PackStats> layer_stats(static_cast<size_t>(c.num_layers));
  w.layers.resize(static_cast<size_t>(c.num_layers));
  // Layers are packed on the session's pool (one layer per item): no threads
  // of setup's own. A task must not throw (the pool would terminate), so the
  // first error is kept and the remaining layers are skipped.
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto load = [&](size_t l) {
    if (failed.load(std::memory_order_relaxed)) return;
    try {
      w.layers[l] = load_layer(plan.layers[l], c, quant, isa, layer_stats[l]);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
  };
  if (pool)
    pool->parallel_for(w.layers.size(), load);
  else
    for (size_t l = 0; l < w.layers.size(); ++l) load(l);
  if (first_error) std::rethrow_exception(first_error);
  for (const PackStats& s : layer_stats) {
    w.decode_bytes += s.bytes;
    if (s.rounded_from) w.rounded_from = s.rounded_from;
  }

  w.final_norm = to_float(*plan.final_norm, norm_add);
  if (plan.lm_head == plan.embed && w.embed_quant.quant) {  // tied: the GGUF table is the head too
    w.lm_head = w.embed_quant;
    w.decode_bytes += w.lm_head.quant->bytes();
  } else {
    // Nothing may point into the mapping after setup (the session unmaps it): a
    // tied embedding is read back from the packed lm_head, an untied one copied.
    if (plan.lm_head != plan.embed && !w.embed_quant.quant && append_bf16(*plan.embed, w.embed))
      w.rounded_from = dtype_name(plan.embed->dtype);
    PackStats head;
    w.lm_head = pack(quant, {plan.lm_head}, head, isa);
    w.decode_bytes += head.bytes;
    if (head.rounded_from) w.rounded_from = head.rounded_from;
  }
  return w;
}

}  // namespace edgellm
