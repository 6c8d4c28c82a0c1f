#include "models/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "edgellm/bf16.h"
#include "edgellm/error.h"

namespace edgellm {

namespace {

// Inverse frequencies of one RoPE base, with the config's scaling (HF
// _compute_default_rope_parameters / _compute_llama3_parameters).
std::vector<double> inverse_frequencies(const ModelConfig& c, float theta, bool scaled) {
  const size_t half = static_cast<size_t>(c.head_dim) / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    // HF computes in float32: 1 / theta ** (arange(0, dim, 2) / dim)
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv[i] = 1.0f / std::pow(theta, exponent);
  }
  const RopeScaling& rs = c.rope_scaling;
  if (!scaled || rs.type == RopeScaling::Type::none) return inv;
  if (rs.type == RopeScaling::Type::linear) {
    for (double& f : inv) f /= rs.factor;
    return inv;
  }
  const double low_wavelen = rs.original_max_position / rs.low_freq_factor;
  const double high_wavelen = rs.original_max_position / rs.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > low_wavelen) {
      f /= rs.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) /
                            (rs.high_freq_factor - rs.low_freq_factor);
      f = (1 - smooth) * f / rs.factor + smooth * f;
    }
  }
  return inv;
}

RopeTable make_rope_table(const ModelConfig& c, float theta, bool scaled, size_t max_context) {
  RopeTable t{theta, scaled, {}, {}};
  const std::vector<double> inv = inverse_frequencies(c, theta, scaled);
  const size_t half = inv.size();
  t.cos.resize(max_context * half);
  t.sin.resize(max_context * half);
  for (size_t p = 0; p < max_context; ++p) {
    for (size_t i = 0; i < half; ++i) {
      // HF: freqs = (inv_freq.float() @ position.float()) in fp32, then cos/sin.
      const float angle = static_cast<float>(p) * static_cast<float>(inv[i]);
      t.cos[p * half + i] = std::cos(angle);
      t.sin[p * half + i] = std::sin(angle);
    }
  }
  return t;
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, ModelWeights weights, int max_context,
                         ThreadPool& pool, Profiler& profiler)
    : c_(config),
      weights_(std::move(weights)),
      max_context_(static_cast<size_t>(max_context)),
      pool_(pool),
      prof_(profiler) {
  for (const LayerSpec& spec : c_.layers) {
    const bool scaled = spec.rope_scaled && c_.rope_scaling.type != RopeScaling::Type::none;
    auto it = std::find_if(rope_tables_.begin(), rope_tables_.end(), [&](const RopeTable& t) {
      return t.theta == spec.rope_theta && t.scaled == scaled;
    });
    if (it == rope_tables_.end())
      rope_tables_.push_back(make_rope_table(c_, spec.rope_theta, scaled, max_context_));
  }
  for (const LayerSpec& spec : c_.layers) {
    const bool scaled = spec.rope_scaled && c_.rope_scaling.type != RopeScaling::Type::none;
    for (const RopeTable& t : rope_tables_)
      if (t.theta == spec.rope_theta && t.scaled == scaled) layer_rope_.push_back(&t);
  }
  const size_t cache =
      static_cast<size_t>(c_.num_layers) * c_.num_kv_heads * max_context_ * c_.head_dim;
  k_cache_.assign(cache, 0.0f);
  v_cache_.assign(cache, 0.0f);
  ensure_scratch(1);
}

void Transformer::ensure_scratch(size_t n) {
  if (n <= scratch_tokens_) return;
  const size_t H = c_.hidden_size, D = c_.head_dim, I = c_.intermediate_size;
  const size_t q_width = c_.num_heads * D, qkv_width = (c_.num_heads + 2 * c_.num_kv_heads) * D;
  x_.resize(n * H);
  xn_.resize(n * H);
  qkv_.resize(n * qkv_width);
  q_.resize(n * q_width);
  attn_.resize(n * q_width);
  proj_.resize(n * H);
  gate_up_.resize(n * 2 * I);
  act_.resize(n * I);
  scratch_tokens_ = n;
}

void Transformer::attention_block(size_t l, size_t n, size_t start) {
  const LayerWeights& L = weights_.layers[l];
  const size_t H = c_.hidden_size, D = c_.head_dim;
  const size_t nh = c_.num_heads, nkv = c_.num_kv_heads;
  const size_t qkv_width = (nh + 2 * nkv) * D;
  {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = 0; t < n; ++t)
      kernels::rmsnorm(&x_[t * H], L.attn_norm.data(), H, c_.rms_norm_eps, &xn_[t * H]);
  }
  {
    Profiler::Scope z(prof_, Zone::qkv_proj, 2.0 * L.qkv.rows * L.qkv.cols,
                      2.0 * n * L.qkv.rows * L.qkv.cols);
    kernels::matmul(L.qkv, xn_.data(), n, qkv_.data(), pool_);
  }
  if (c_.qk_norm) {
    Profiler::Scope z(prof_, Zone::qk_norm);
    for (size_t t = 0; t < n; ++t) {
      float* row = &qkv_[t * qkv_width];
      for (size_t h = 0; h < nh; ++h)
        kernels::rmsnorm(row + h * D, L.q_norm.data(), D, c_.rms_norm_eps, row + h * D);
      for (size_t h = 0; h < nkv; ++h)
        kernels::rmsnorm(row + (nh + h) * D, L.k_norm.data(), D, c_.rms_norm_eps,
                         row + (nh + h) * D);
    }
  }
  const size_t layer_cache = l * nkv * max_context_ * D;
  {
    Profiler::Scope z(prof_, Zone::rope);
    const RopeTable& rope = *layer_rope_[l];
    for (size_t t = 0; t < n; ++t) {
      const size_t pos = start + t;
      float* row = &qkv_[t * qkv_width];
      const float* cos = &rope.cos[pos * D / 2];
      const float* sin = &rope.sin[pos * D / 2];
      kernels::rope(row, nh + nkv, D, cos, sin);  // q heads and k heads are contiguous
      std::memcpy(&q_[t * nh * D], row, nh * D * sizeof(float));
      for (size_t h = 0; h < nkv; ++h) {
        const size_t slot = layer_cache + (h * max_context_ + pos) * D;
        std::memcpy(&k_cache_[slot], row + (nh + h) * D, D * sizeof(float));
        std::memcpy(&v_cache_[slot], row + (nh + nkv + h) * D, D * sizeof(float));
      }
    }
  }
  {
    const double keys = static_cast<double>(start + n);
    Profiler::Scope z(prof_, Zone::attention, 2.0 * 4 * keys * nkv * D, 4.0 * n * keys * nh * D);
    kernels::AttentionArgs a;
    a.q = q_.data();
    a.k_cache = &k_cache_[layer_cache];
    a.v_cache = &v_cache_[layer_cache];
    a.out = attn_.data();
    a.n = n;
    a.start = start;
    a.n_heads = nh;
    a.n_kv_heads = nkv;
    a.head_dim = D;
    a.cache_stride = max_context_;
    a.window = static_cast<size_t>(c_.layers[l].sliding_window);
    a.scale = c_.query_scale;
    a.softcap = c_.attn_logit_softcap;
    kernels::attention(a, pool_);
  }
  {
    Profiler::Scope z(prof_, Zone::o_proj, 2.0 * L.o_proj.rows * L.o_proj.cols,
                      2.0 * n * L.o_proj.rows * L.o_proj.cols);
    kernels::matmul(L.o_proj, attn_.data(), n, proj_.data(), pool_);
  }
  if (c_.sandwich_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = 0; t < n; ++t)
      kernels::rmsnorm(&proj_[t * H], L.post_attn_norm.data(), H, c_.rms_norm_eps, &proj_[t * H]);
  }
  Profiler::Scope z(prof_, Zone::residual);
  kernels::add(x_.data(), proj_.data(), n * H);
}

void Transformer::mlp_block(size_t l, size_t n) {
  const LayerWeights& L = weights_.layers[l];
  const size_t H = c_.hidden_size, I = c_.intermediate_size;
  {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = 0; t < n; ++t)
      kernels::rmsnorm(&x_[t * H], L.ffn_norm.data(), H, c_.rms_norm_eps, &xn_[t * H]);
  }
  {
    Profiler::Scope z(prof_, Zone::gate_up_proj, 2.0 * L.gate_up.rows * L.gate_up.cols,
                      2.0 * n * L.gate_up.rows * L.gate_up.cols);
    kernels::matmul(L.gate_up, xn_.data(), n, gate_up_.data(), pool_);
  }
  {
    Profiler::Scope z(prof_, Zone::activation);
    for (size_t t = 0; t < n; ++t) {
      const float* gate = &gate_up_[t * 2 * I];
      if (c_.hidden_act == Activation::silu)
        kernels::silu_mul(gate, gate + I, I, &act_[t * I]);
      else
        kernels::gelu_tanh_mul(gate, gate + I, I, &act_[t * I]);
    }
  }
  {
    Profiler::Scope z(prof_, Zone::down_proj, 2.0 * L.down.rows * L.down.cols,
                      2.0 * n * L.down.rows * L.down.cols);
    kernels::matmul(L.down, act_.data(), n, proj_.data(), pool_);
  }
  if (c_.sandwich_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = 0; t < n; ++t)
      kernels::rmsnorm(&proj_[t * H], L.post_ffn_norm.data(), H, c_.rms_norm_eps, &proj_[t * H]);
  }
  Profiler::Scope z(prof_, Zone::residual);
  kernels::add(x_.data(), proj_.data(), n * H);
}

void Transformer::forward(const int32_t* tokens, size_t n, size_t start, float* logits,
                          PrefillCapture* capture) {
  ensure_scratch(n);
  const size_t H = c_.hidden_size;
  {
    Profiler::Scope z(prof_, Zone::embed);
    for (size_t t = 0; t < n; ++t) {
      float* x = &x_[t * H];
      if (weights_.embed) {
        const uint16_t* row = weights_.embed + static_cast<size_t>(tokens[t]) * H;
        for (size_t i = 0; i < H; ++i) x[i] = bf16_to_float(row[i]) * c_.embedding_scale;
      } else {  // quantized table: the row exactly as the GGUF dequantizes it
        kernels::unpack_row(weights_.embed_quant, static_cast<size_t>(tokens[t]), x);
        for (size_t i = 0; i < H; ++i) x[i] *= c_.embedding_scale;
      }
    }
  }
  if (capture) capture->layer_outputs.assign(c_.num_layers, {});
  for (size_t l = 0; l < static_cast<size_t>(c_.num_layers); ++l) {
    attention_block(l, n, start);
    mlp_block(l, n);
    if (capture) capture->layer_outputs[l].assign(x_.begin(), x_.begin() + n * H);
  }
  // Only the last position needs logits; diagnosis also wants every normed row.
  const size_t first = capture ? 0 : n - 1;
  {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = first; t < n; ++t)
      kernels::rmsnorm(&x_[t * H], weights_.final_norm.data(), H, c_.rms_norm_eps, &xn_[t * H]);
  }
  if (capture) capture->final_hidden.assign(xn_.begin(), xn_.begin() + n * H);
  {
    const kernels::PackedMatrix& head = weights_.lm_head;
    Profiler::Scope z(prof_, Zone::lm_head, 2.0 * head.rows * head.cols,
                      2.0 * head.rows * head.cols);
    kernels::matmul(head, &xn_[(n - 1) * H], 1, logits, pool_);
    if (c_.final_logit_softcap > 0.0f) {
      const float cap = c_.final_logit_softcap;
      for (size_t i = 0; i < head.rows; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
    }
  }
}

}  // namespace edgellm
