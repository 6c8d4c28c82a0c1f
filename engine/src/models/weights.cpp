#include "models/weights.h"

#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

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
  TensorSource(const Checkpoint& ckpt, const QuantSource* quant) : ckpt_(ckpt), quant_(quant) {}
  const QuantSource* quant() const { return quant_; }

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
  const QuantSource* quant_;
};

float element(const TensorView& t, size_t i) {
  switch (t.dtype) {
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::f32:
      return static_cast<const float*>(t.data)[i];
  }
  return 0.0f;
}

// Appends a tensor's values as bf16 (the engine's weight dtype), rejecting
// non-finite values: safetensors has no checksum, and a flipped exponent bit
// in a corrupted file usually shows up as inf/NaN.
void append_bf16(const TensorView& t, std::vector<uint16_t>& out) {
  const size_t n = static_cast<size_t>(t.numel());
  const size_t base = out.size();
  out.resize(base + n);
  for (size_t i = 0; i < n; ++i) {
    const float v = element(t, i);
    if (!std::isfinite(v))  // not check(): the message must not be built per element
      throw Error(t.file + ": tensor '" + t.name + "' holds a non-finite value at index " +
                  std::to_string(i) + " (corrupt file?)");
    out[base + i] =
        t.dtype == DType::bf16 ? static_cast<const uint16_t*>(t.data)[i] : float_to_bf16(v);
  }
}

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
                                   g.row_order.empty() ? nullptr : g.row_order.data()));
      release_mapped_pages(g.blocks, g.nbytes);  // peak memory: the repacked copy only
    } else if (quant->quantize && cols % 32 == 0) {
      std::vector<uint16_t> bf16;
      append_bf16(*t, bf16);
      std::vector<float> f(bf16.size());
      for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_float(bf16[i]);
      kernels::append_segment(*m, kernels::quantize_rows(*quant->quantize, f.data(), rows, cols));
    } else {
      check(m->segments.empty(), "checkpoint: tensor '" + t->name +
                                     "' has no quantized form but the tensors fused with it do");
      return nullptr;
    }
  }
  return m;
}

kernels::PackedMatrix pack(const TensorSource& src, std::initializer_list<const TensorView*> parts,
                           size_t& bytes) {
  if (auto q = pack_quant(src.quant(), parts)) {
    kernels::PackedMatrix m;
    m.rows = q->rows;
    m.cols = q->cols;
    bytes += q->bytes();
    m.quant = std::move(q);
    for (const TensorView* t : parts) t->release_pages();
    return m;
  }
  std::vector<uint16_t> rows;
  size_t n_rows = 0, cols = static_cast<size_t>(parts.begin()[0]->shape[1]);
  for (const TensorView* t : parts) {
    append_bf16(*t, rows);
    n_rows += static_cast<size_t>(t->shape[0]);
  }
  bytes += rows.size() * sizeof(uint16_t);
  for (const TensorView* t : parts) t->release_pages();
  return kernels::pack_matrix(rows.data(), n_rows, cols);
}

// One layer's tensors, looked up, checked and packed. Layers are independent, so
// setup packs them in parallel (validation and packing dominate setup time).
LayerWeights load_layer(const TensorSource& src, const ModelConfig& c, int l, size_t& bytes) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_rows = c.num_heads * D, kv_rows = c.num_kv_heads * D;
  const float norm_add = c.norm_adds_one ? 1.0f : 0.0f;  // Gemma stores w, applies (1 + w)
  const std::string p = "model.layers." + std::to_string(l) + ".";
  LayerWeights L;
  L.attn_norm = to_float(src.required(p + "input_layernorm.weight", {H}), norm_add);
  L.qkv = pack(src,
               {&src.required(p + "self_attn.q_proj.weight", {q_rows, H}),
                &src.required(p + "self_attn.k_proj.weight", {kv_rows, H}),
                &src.required(p + "self_attn.v_proj.weight", {kv_rows, H})},
               bytes);
  if (c.attention_bias) {
    for (const char* b : {"q_proj.bias", "k_proj.bias", "v_proj.bias"}) {
      const bool is_q = b[0] == 'q';
      auto v = to_float(src.required(p + "self_attn." + b, {is_q ? q_rows : kv_rows}), 0.0f);
      L.qkv_bias.insert(L.qkv_bias.end(), v.begin(), v.end());
    }
  }
  if (c.qk_norm) {
    L.q_norm = to_float(src.required(p + "self_attn.q_norm.weight", {D}), norm_add);
    L.k_norm = to_float(src.required(p + "self_attn.k_norm.weight", {D}), norm_add);
  }
  L.o_proj = pack(src, {&src.required(p + "self_attn.o_proj.weight", {H, q_rows})}, bytes);
  if (c.sandwich_norms) {
    // Gemma 3: post_attention_layernorm follows attention; pre_feedforward_layernorm precedes the
    // MLP.
    L.post_attn_norm = to_float(src.required(p + "post_attention_layernorm.weight", {H}), norm_add);
    L.ffn_norm = to_float(src.required(p + "pre_feedforward_layernorm.weight", {H}), norm_add);
    L.post_ffn_norm =
        to_float(src.required(p + "post_feedforward_layernorm.weight", {H}), norm_add);
  } else {
    // Llama family: post_attention_layernorm is the norm before the MLP.
    L.ffn_norm = to_float(src.required(p + "post_attention_layernorm.weight", {H}), norm_add);
  }
  L.gate_up = pack(src,
                   {&src.required(p + "mlp.gate_proj.weight", {I, H}),
                    &src.required(p + "mlp.up_proj.weight", {I, H})},
                   bytes);
  L.down = pack(src, {&src.required(p + "mlp.down_proj.weight", {H, I})}, bytes);
  return L;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, int threads,
                          const QuantSource* quant) {
  TensorSource src(ckpt, quant);
  ModelWeights w;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float norm_add = c.norm_adds_one ? 1.0f : 0.0f;  // Gemma stores w, applies (1 + w)

  const TensorView& embed = src.required("model.embed_tokens.weight", {V, H});
  if (quant && quant->gguf.count(embed.name)) {  // lookups dequantize rows of the GGUF table
    size_t table_bytes = 0;                      // a lookup reads one row per token, not the table
    w.embed_quant = pack(src, {&embed}, table_bytes);
  } else if (embed.dtype == DType::bf16) {
    w.embed = static_cast<const uint16_t*>(embed.data);
  } else {
    append_bf16(embed, w.embed_owned);
    w.embed = w.embed_owned.data();
  }

  std::vector<size_t> layer_bytes(static_cast<size_t>(c.num_layers), 0);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  std::atomic<int> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (int l; (l = next.fetch_add(1)) < c.num_layers;) {
      try {
        w.layers[l] = load_layer(src, c, l, layer_bytes[l]);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        next = c.num_layers;  // stop the others early
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(worker);
    worker();
  }
  if (first_error) std::rethrow_exception(first_error);
  for (size_t b : layer_bytes) w.decode_bytes += b;
  for (auto& L : w.layers)
    if (!L.qkv_bias.empty()) L.qkv.bias = L.qkv_bias.data();

  w.final_norm = to_float(src.required("model.norm.weight", {H}), norm_add);
  const TensorView* head = src.optional("lm_head.weight", {V, H});
  check(head || c.tie_word_embeddings,
        "checkpoint: tensor 'lm_head.weight' is missing and config.json does not tie word "
        "embeddings");
  if ((c.tie_word_embeddings || !head) &&
      w.embed_quant.quant) {  // tied: the GGUF table is the LM head too
    w.lm_head = w.embed_quant;
    w.decode_bytes += w.lm_head.quant->bytes();
  } else {
    w.lm_head = pack(src, {head && !c.tie_word_embeddings ? head : &embed}, w.decode_bytes);
  }
  return w;
}

}  // namespace edgellm
