#include "models/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "edgellm/bf16.h"
#include "edgellm/error.h"
#include "kernels/avx512.h"
#include "kernels/quant.h"

namespace edgellm {

// kMinPrefillChunk's promise: from that many tokens on, every kernel of a
// prefill takes its prefill path (below, the decode ones).
static_assert(kMinPrefillChunk == kernels::avx512::kMinPrefillTokens &&
              kMinPrefillChunk == kernels::amx::kMinTokens &&
              kMinPrefillChunk == kernels::amx::kMinQuantTokens);

namespace {

// YaRN's inverse frequencies (HF _compute_yarn_parameters, in float32 as torch computes them):
// a linear ramp over the dims [low, high] blends 1 / theta^(2i/dim) (extrapolation) into the
// same divided by factor (interpolation); low and high are the dims whose wavelengths fit
// beta_fast and beta_slow rotations into original_max_position (in double, as Python's math).
std::vector<double> yarn_frequencies(const RopeScaling& rs, float theta, size_t dim) {
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(rs.original_max_position / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a division by zero
  const size_t half = dim / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (rs.factor * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

// Inverse frequencies of one RoPE base over the rotary dims, with the config's scaling (HF
// _compute_default_rope_parameters / _compute_llama3_parameters / _compute_longrope_parameters).
std::vector<double> inverse_frequencies(const ModelConfig& c, float theta, bool scaled) {
  const size_t dim = static_cast<size_t>(c.rotary_dims()), half = dim / 2;
  const RopeScaling& rs = c.rope_scaling;
  const bool longrope = scaled && rs.type == RopeScaling::Type::longrope;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    // HF computes in float32: 1 / theta ** (arange(0, dim, 2) / dim)
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    if (longrope)  // 1 / (short_factor * theta ** ...), every step in float32
      inv[i] = 1.0f / (rs.short_factor[i] * static_cast<float>(std::pow(theta, exponent)));
    else
      inv[i] = 1.0f / std::pow(theta, exponent);
  }
  if (!scaled || rs.type == RopeScaling::Type::none || longrope) return inv;
  if (rs.type == RopeScaling::Type::yarn) return yarn_frequencies(rs, theta, dim);
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
  // LongRoPE and YaRN scale cos and sin (HF: emb.cos() * attention_scaling, in float32).
  const bool scales_cos = c.rope_scaling.type == RopeScaling::Type::longrope ||
                          c.rope_scaling.type == RopeScaling::Type::yarn;
  const float scale = scaled && scales_cos ? c.rope_scaling.attention_factor : 1.0f;
  t.cos.resize(max_context * half);
  t.sin.resize(max_context * half);
  for (size_t p = 0; p < max_context; ++p) {
    for (size_t i = 0; i < half; ++i) {
      // HF: freqs = (inv_freq.float() @ position.float()) in fp32, then cos/sin.
      const float angle = static_cast<float>(p) * static_cast<float>(inv[i]);
      t.cos[p * half + i] = std::cos(angle) * scale;
      t.sin[p * half + i] = std::sin(angle) * scale;
    }
  }
  return t;
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, ModelWeights weights, int max_context,
                         ThreadPool& pool, Profiler& profiler, const kernels::ExecConfig& cfg)
    : c_(config),
      weights_(std::move(weights)),
      max_context_(static_cast<size_t>(max_context)),
      cfg_(cfg),
      pool_(pool),
      prof_(profiler) {
  if (cfg_.kv == kernels::KvDtype::q8_0 && c_.head_dim % kernels::kKvQ8Block != 0)
    throw Error("a q8_0 KV cache needs head_dim % 32 == 0, not " + std::to_string(c_.head_dim));
  // Each matrix took its type-traits row at packing: it must be the row of the
  // tier this model runs at, or EDGELLM_ISA would not reach its matmuls.
  const auto check_tier = [&](const kernels::PackedMatrix& m) {
    if (m.kernels && m.kernels != &kernels::matmul_kernels(m.kernels->format, cfg_.isa))
      throw Error("weights packed for " + std::string(kernels::isa_name(m.kernels->tier)) +
                  " but the model runs at " + std::string(kernels::isa_name(cfg_.isa)));
  };
  for (const LayerWeights& L : weights_.layers) {
    for (const kernels::PackedMatrix* m :
         {&L.qkv, &L.o_proj, &L.gate_up, &L.down, &L.router, &L.shared_expert_gate})
      check_tier(*m);
    for (const auto* experts : {&L.expert_gate_up, &L.expert_down})
      for (const kernels::PackedMatrix& m : *experts) check_tier(m);
  }
  check_tier(weights_.lm_head);
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
}

void KvCache::store(size_t offset, const float* key, const float* value, size_t n) {
  if (dtype == kernels::KvDtype::q8_0) {
    const size_t s = offset / kernels::kKvQ8Block;
    kernels::quantize_kv_q8_0(key, n, &k8[offset], &k_scale[s]);
    kernels::quantize_kv_q8_0(value, n, &v8[offset], &v_scale[s]);
  } else if (dtype == kernels::KvDtype::bf16) {
    for (size_t i = 0; i < n; ++i) {
      k16[offset + i] = float_to_bf16(key[i]);
      v16[offset + i] = float_to_bf16(value[i]);
    }
  } else {
    std::memcpy(&k[offset], key, n * sizeof(float));
    std::memcpy(&v[offset], value, n * sizeof(float));
  }
}

KvCache Transformer::new_kv_cache() const {
  const size_t cache =
      static_cast<size_t>(c_.num_layers) * c_.num_kv_heads * max_context_ * c_.head_dim;
  KvCache kv;
  kv.dtype = cfg_.kv;
  if (cfg_.kv == kernels::KvDtype::q8_0) {
    kv.k8.assign(cache, 0);
    kv.v8.assign(cache, 0);
    kv.k_scale.assign(cache / kernels::kKvQ8Block, 0);
    kv.v_scale.assign(cache / kernels::kKvQ8Block, 0);
  } else if (cfg_.kv == kernels::KvDtype::bf16) {
    kv.k16.assign(cache, 0);
    kv.v16.assign(cache, 0);
  } else {
    kv.k.assign(cache, 0.0f);
    kv.v.assign(cache, 0.0f);
  }
  return kv;
}

size_t Transformer::kv_cache_bytes() const {
  return 2 * kernels::kv_bytes(cfg_.kv, static_cast<size_t>(c_.num_layers) * c_.num_kv_heads *
                                            max_context_ * c_.head_dim);
}

namespace {

// fn(bytes, size) for each contiguous run that positions [start, start + n)
// occupy in `kv`: one per array, layer and KV head ([layer][kv_head][position]).
template <typename Cache, typename Fn>
void for_kv_runs(Cache& kv, size_t heads, size_t max_context, size_t head_dim, size_t start,
                 size_t n, Fn&& fn) {
  const auto runs = [&](auto& array, size_t per_position) {
    using Byte = std::conditional_t<std::is_const_v<Cache>, const uint8_t, uint8_t>;
    const size_t elem = sizeof(array[0]);
    for (size_t h = 0; h < heads; ++h)
      fn(reinterpret_cast<Byte*>(array.data() + (h * max_context + start) * per_position),
         n * per_position * elem);
  };
  switch (kv.dtype) {
    case kernels::KvDtype::bf16:
      runs(kv.k16, head_dim);
      runs(kv.v16, head_dim);
      break;
    case kernels::KvDtype::q8_0:
      runs(kv.k8, head_dim);
      runs(kv.v8, head_dim);
      runs(kv.k_scale, head_dim / kernels::kKvQ8Block);
      runs(kv.v_scale, head_dim / kernels::kKvQ8Block);
      break;
    default:
      runs(kv.k, head_dim);
      runs(kv.v, head_dim);
  }
}

}  // namespace

size_t Transformer::kv_span_bytes(size_t n) const {
  const size_t heads = static_cast<size_t>(c_.num_layers) * c_.num_kv_heads;
  return 2 * kernels::kv_bytes(cfg_.kv, heads * n * c_.head_dim);
}

void Transformer::save_kv(const KvCache& kv, size_t start, size_t n, uint8_t* out) const {
  for_kv_runs(kv, static_cast<size_t>(c_.num_layers) * c_.num_kv_heads, max_context_, c_.head_dim,
              start, n, [&](const uint8_t* run, size_t bytes) {
                std::memcpy(out, run, bytes);
                out += bytes;
              });
}

void Transformer::load_kv(KvCache& kv, size_t start, size_t n, const uint8_t* in) const {
  for_kv_runs(kv, static_cast<size_t>(c_.num_layers) * c_.num_kv_heads, max_context_, c_.head_dim,
              start, n, [&](uint8_t* run, size_t bytes) {
                std::memcpy(run, in, bytes);
                in += bytes;
              });
}

void Transformer::ensure_scratch(Scratch& s, size_t n) const {
  if (n <= s.tokens) return;
  const size_t H = c_.hidden_size, D = c_.head_dim, I = c_.intermediate_size;
  const size_t q_width = c_.num_heads * D, qkv_width = (c_.num_heads + 2 * c_.num_kv_heads) * D;
  s.x.resize(n * H);
  s.xn.resize(n * H);
  s.qkv.resize(n * qkv_width);
  s.q.resize(n * q_width);
  s.attn.resize(n * q_width);
  s.proj.resize(n * H);
  s.gate_up.resize(n * 2 * I);
  s.act.resize(n * I);
  s.tokens = n;
}

void Transformer::add_residual(Scratch& s, size_t n) {
  const size_t H = c_.hidden_size;
  Profiler::Scope z(prof_, Zone::residual);
  for_tokens(n, [&](size_t t) {
    float* out = &s.proj[t * H];
    if (c_.residual_scale != 1.0f)  // Granite: residual + out * residual_multiplier, as HF rounds
      for (size_t i = 0; i < H; ++i) out[i] *= c_.residual_scale;
    kernels::add(&s.x[t * H], out, H, cfg_.isa);
  });
}

void Transformer::attention_block(size_t l, Scratch& s, std::span<const SequenceRows> seqs,
                                  size_t n, kernels::Batch batch) {
  const LayerWeights& L = weights_.layers[l];
  const size_t H = c_.hidden_size, D = c_.head_dim;
  const size_t nh = c_.num_heads, nkv = c_.num_kv_heads;
  const size_t qkv_width = (nh + 2 * nkv) * D;
  if (c_.pre_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for_tokens(n, [&](size_t t) {
      kernels::rmsnorm(&s.x[t * H], L.attn_norm.data(), H, c_.rms_norm_eps, &s.xn[t * H], cfg_.isa);
    });
  }
  {
    Profiler::Scope z(prof_, Zone::qkv_proj, static_cast<double>(L.qkv.byte_size()),
                      2.0 * n * L.qkv.rows * L.qkv.cols);
    kernels::matmul(L.qkv, block_input(s), n, s.qkv.data(), pool_, cfg_, batch);
  }
  if (c_.qk_norm_whole) {
    Profiler::Scope z(prof_, Zone::qk_norm);
    for_tokens(n, [&](size_t t) {
      float* row = &s.qkv[t * qkv_width];
      kernels::rmsnorm(row, L.q_norm.data(), nh * D, c_.rms_norm_eps, row, cfg_.isa);
      kernels::rmsnorm(row + nh * D, L.k_norm.data(), nkv * D, c_.rms_norm_eps, row + nh * D,
                       cfg_.isa);
    });
  } else if (c_.qk_norm) {
    Profiler::Scope z(prof_, Zone::qk_norm);
    for_tokens(n, [&](size_t t) {
      float* row = &s.qkv[t * qkv_width];
      for (size_t h = 0; h < nh; ++h)
        kernels::rmsnorm(row + h * D, L.q_norm.data(), D, c_.rms_norm_eps, row + h * D, cfg_.isa);
      for (size_t h = 0; h < nkv; ++h)
        kernels::rmsnorm(row + (nh + h) * D, L.k_norm.data(), D, c_.rms_norm_eps,
                         row + (nh + h) * D, cfg_.isa);
    });
  }
  const size_t layer_cache = l * nkv * max_context_ * D;
  {
    Profiler::Scope z(prof_, Zone::rope);
    const RopeTable& rope = *layer_rope_[l];
    const size_t R = static_cast<size_t>(c_.rotary_dims());
    size_t row0 = 0;  // the sequence's first row of the batch
    for (const SequenceRows& seq : seqs) {
      for_tokens(seq.n, [&](size_t i) {
        const size_t t = row0 + i, pos = seq.start + i;
        float* row = &s.qkv[t * qkv_width];
        const float* cos = &rope.cos[pos * R / 2];
        const float* sin = &rope.sin[pos * R / 2];
        if (c_.layers[l].rope)  // q heads and k heads are contiguous
          kernels::rope(row, nh + nkv, D, R, cos, sin, cfg_.isa);
        std::memcpy(&s.q[t * nh * D], row, nh * D * sizeof(float));
        for (size_t h = 0; h < nkv; ++h) {
          const size_t slot = layer_cache + (h * max_context_ + seq.cache_base + pos) * D;
          seq.kv->store(slot, row + (nh + h) * D, row + (nh + nkv + h) * D, D);
        }
      });
      row0 += seq.n;
    }
  }
  const auto attention_args = [&](const SequenceRows& seq, size_t row0) {
    const size_t base = layer_cache + seq.cache_base * D;  // the sequence's position 0
    kernels::AttentionArgs a;
    a.q = &s.q[row0 * nh * D];
    a.k_cache = seq.kv->keys(base);
    a.v_cache = seq.kv->values(base);
    a.kv_dtype = seq.kv->dtype;
    a.k_scale = seq.kv->key_scales(base);
    a.v_scale = seq.kv->value_scales(base);
    a.out = &s.attn[row0 * nh * D];
    a.n = seq.n;
    a.start = seq.start;
    a.n_heads = nh;
    a.n_kv_heads = nkv;
    a.head_dim = D;
    a.cache_stride = max_context_;
    a.window = static_cast<size_t>(c_.layers[l].sliding_window);
    a.scale = c_.query_scale;
    a.softcap = c_.attn_logit_softcap;
    a.sinks = L.sinks.empty() ? nullptr : L.sinks.data();
    a.precision = cfg_.attention;
    return a;
  };
  // (bytes, flops) of one sequence's attention, for the profiler.
  const auto attention_cost = [&](const SequenceRows& seq) {
    const double keys = static_cast<double>(seq.start + seq.n);
    const double elem = static_cast<double>(kernels::kv_dtype_bytes(seq.kv->dtype));
    return std::pair{2.0 * elem * keys * nkv * D, kernels::attention_flops(attention_args(seq, 0))};
  };
  if (batch == kernels::Batch::independent && seqs.size() > 1) {
    // A decode batch runs its sequences side by side, one per thread: each
    // call then runs its work items serially (nested), the same items and
    // arithmetic as alone, so the output stays bit-identical, and one pool
    // dispatch replaces one per sequence of a few microseconds of work.
    double bytes = 0, flops = 0;
    for (const SequenceRows& seq : seqs) {
      const auto [b, f] = attention_cost(seq);
      bytes += b;
      flops += f;
    }
    Profiler::Scope z(prof_, Zone::attention, bytes, flops);
    pool_.parallel_for(seqs.size(), [&](size_t i) {
      kernels::attention(attention_args(seqs[i], i), pool_, cfg_.isa);  // a batch row is one token
    });
  } else {
    size_t row0 = 0;
    for (const SequenceRows& seq : seqs) {
      const auto [bytes, flops] = attention_cost(seq);
      Profiler::Scope z(prof_, Zone::attention, bytes, flops);
      kernels::attention(attention_args(seq, row0), pool_, cfg_.isa);
      row0 += seq.n;
    }
  }
  {
    Profiler::Scope z(prof_, Zone::o_proj, static_cast<double>(L.o_proj.byte_size()),
                      2.0 * n * L.o_proj.rows * L.o_proj.cols);
    kernels::matmul(L.o_proj, s.attn.data(), n, s.proj.data(), pool_, cfg_, batch);
  }
  if (c_.sandwich_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for_tokens(n, [&](size_t t) {
      kernels::rmsnorm(&s.proj[t * H], L.post_attn_norm.data(), H, c_.rms_norm_eps, &s.proj[t * H],
                       cfg_.isa);
    });
  }
  add_residual(s, n);
}

void Transformer::mlp_block(size_t l, Scratch& s, size_t n, kernels::Batch batch) {
  const LayerWeights& L = weights_.layers[l];
  const size_t H = c_.hidden_size;
  if (c_.pre_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for_tokens(n, [&](size_t t) {
      kernels::rmsnorm(&s.x[t * H], L.ffn_norm.data(), H, c_.rms_norm_eps, &s.xn[t * H], cfg_.isa);
    });
  }
  if (c_.layers[l].moe)
    moe_feed_forward(L, c_, block_input(s), n, s.proj.data(), s.moe, pool_, cfg_, batch, prof_);
  else
    dense_mlp(L, s, n, batch);
  if (c_.sandwich_norms) {
    Profiler::Scope z(prof_, Zone::norm);
    for_tokens(n, [&](size_t t) {
      kernels::rmsnorm(&s.proj[t * H], L.post_ffn_norm.data(), H, c_.rms_norm_eps, &s.proj[t * H],
                       cfg_.isa);
    });
  }
  add_residual(s, n);
}

void Transformer::dense_mlp(const LayerWeights& L, Scratch& s, size_t n, kernels::Batch batch) {
  const size_t I = c_.intermediate_size;
  {
    Profiler::Scope z(prof_, Zone::gate_up_proj, static_cast<double>(L.gate_up.byte_size()),
                      2.0 * n * L.gate_up.rows * L.gate_up.cols);
    kernels::matmul(L.gate_up, block_input(s), n, s.gate_up.data(), pool_, cfg_, batch);
  }
  {
    Profiler::Scope z(prof_, Zone::activation);
    for_tokens(n, [&](size_t t) {
      const float* gate = &s.gate_up[t * 2 * I];
      if (c_.hidden_act == Activation::silu)
        kernels::silu_mul(gate, gate + I, I, &s.act[t * I], cfg_.isa);
      else
        kernels::gelu_tanh_mul(gate, gate + I, I, &s.act[t * I], cfg_.isa);
    });
  }
  {
    Profiler::Scope z(prof_, Zone::down_proj, static_cast<double>(L.down.byte_size()),
                      2.0 * n * L.down.rows * L.down.cols);
    kernels::matmul(L.down, s.act.data(), n, s.proj.data(), pool_, cfg_, batch);
  }
}

void Transformer::forward(KvCache& kv, Scratch& s, const int32_t* tokens, size_t n, size_t start,
                          float* logits, PrefillCapture* capture) {
  const SequenceRows seq{&kv, start, n, logits};
  run({&seq, 1}, s, tokens, n, kernels::Batch::sequence, capture);
}

void Transformer::decode_batch(std::span<const SequenceRows> rows, Scratch& s,
                               const int32_t* tokens) {
  for (const SequenceRows& r : rows)
    if (r.n != 1) throw Error("decode_batch: each sequence decodes exactly one token");
  run(rows, s, tokens, rows.size(), kernels::Batch::independent, nullptr);
}

void Transformer::prefill_packed(std::span<const SequenceRows> seqs, Scratch& s,
                                 const int32_t* tokens, size_t n, float* hidden) {
  for (const SequenceRows& r : seqs)
    if (r.start != 0 || r.kv != seqs[0].kv || (r.logits == nullptr) != (seqs[0].logits == nullptr))
      throw Error("prefill_packed: sequences start at 0 in one cache, all with logits or none");
  run(seqs, s, tokens, n, kernels::Batch::sequence, nullptr, hidden);
}

void Transformer::run(std::span<const SequenceRows> seqs, Scratch& s, const int32_t* tokens,
                      size_t n, kernels::Batch batch, PrefillCapture* capture, float* hidden) {
  // A decode batch's matmuls keep each row its n == 1 GEMV's, bit for bit; a
  // prefill's take the GEMM.
  const bool independent = batch == kernels::Batch::independent;
  ensure_scratch(s, n);
  const size_t H = c_.hidden_size;
  {
    Profiler::Scope z(prof_, Zone::embed);
    for (size_t t = 0; t < n; ++t) {
      weights_.embed_row(static_cast<size_t>(tokens[t]), &s.x[t * H]);
      for (size_t i = 0; i < H; ++i) s.x[t * H + i] *= c_.embedding_scale;
    }
  }
  const bool layers = capture && capture->layers;
  if (layers) capture->layer_outputs.assign(c_.num_layers, {});
  for (size_t l = 0; l < static_cast<size_t>(c_.num_layers); ++l) {
    attention_block(l, s, seqs, n, batch);
    mlp_block(l, s, n, batch);
    if (layers) capture->layer_outputs[l].assign(s.x.begin(), s.x.begin() + n * H);
  }
  if (hidden) return finish_packed(seqs, s, hidden);
  // Only each sequence's last position needs logits (in a batch, every row is
  // one); diagnosis and stage 2 also want every normed row.
  const size_t first = capture || independent ? 0 : n - 1;
  {
    Profiler::Scope z(prof_, Zone::norm);
    for (size_t t = first; t < n; ++t)
      kernels::rmsnorm(&s.x[t * H], weights_.final_norm.data(), H, c_.rms_norm_eps, &s.xn[t * H],
                       cfg_.isa);
  }
  if (layers) capture->final_hidden.assign(s.xn.begin(), s.xn.begin() + n * H);
  {
    const kernels::PackedMatrix& head = weights_.lm_head;
    const size_t rows = n - first;
    Profiler::Scope z(prof_, Zone::lm_head, static_cast<double>(head.byte_size()),
                      2.0 * rows * head.rows * head.cols);
    if (capture && capture->all_logits) {
      // Row by row as decode computes them (Batch::independent: each row is the GEMV's).
      capture->logits.resize(n * head.rows);
      kernels::matmul(head, s.xn.data(), n, capture->logits.data(), pool_, cfg_,
                      kernels::Batch::independent);
      finish_logits(capture->logits.data(), capture->logits.size());
      std::copy_n(&capture->logits[(n - 1) * head.rows], head.rows, seqs[0].logits);
      return;
    }
    if (independent) {
      s.logits.resize(rows * head.rows);
      kernels::matmul(head, s.xn.data(), rows, s.logits.data(), pool_, cfg_, batch);
      for (size_t i = 0; i < rows; ++i)
        std::copy_n(&s.logits[i * head.rows], head.rows, seqs[i].logits);
    } else {
      kernels::matmul(head, &s.xn[(n - 1) * H], 1, seqs[0].logits, pool_, cfg_);
    }
    for (const SequenceRows& seq : seqs) finish_logits(seq.logits, head.rows);
  }
}

void Transformer::finish_packed(std::span<const SequenceRows> seqs, Scratch& s, float* hidden) {
  const size_t H = c_.hidden_size;
  {
    Profiler::Scope z(prof_, Zone::norm);
    size_t end = 0;  // one past the sequence's last row
    for (size_t i = 0; i < seqs.size(); ++i) {
      end += seqs[i].n;
      kernels::rmsnorm(&s.x[(end - 1) * H], weights_.final_norm.data(), H, c_.rms_norm_eps,
                       &s.xn[i * H], cfg_.isa);  // row i <= end - 1: nothing unread is overwritten
    }
    std::copy_n(s.xn.begin(), seqs.size() * H, hidden);
  }
  if (!seqs[0].logits) return;
  const kernels::PackedMatrix& head = weights_.lm_head;
  const size_t rows = seqs.size();
  Profiler::Scope z(prof_, Zone::lm_head, static_cast<double>(head.byte_size()),
                    2.0 * rows * head.rows * head.cols);
  s.logits.resize(rows * head.rows);
  // Each row as a plain prefill's last row computes it (the GEMV's arithmetic).
  kernels::matmul(head, s.xn.data(), rows, s.logits.data(), pool_, cfg_,
                  kernels::Batch::independent);
  for (size_t i = 0; i < rows; ++i) {
    std::copy_n(&s.logits[i * head.rows], head.rows, seqs[i].logits);
    finish_logits(seqs[i].logits, head.rows);
  }
}

void Transformer::finish_logits(float* logits, size_t n) const {
  if (c_.logit_divisor != 1.0f)
    for (size_t i = 0; i < n; ++i) logits[i] /= c_.logit_divisor;
  if (c_.final_logit_softcap > 0.0f) {
    const float cap = c_.final_logit_softcap;
    for (size_t i = 0; i < n; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

}  // namespace edgellm
