// The decoder-only forward pass shared by every supported family (Llama,
// SmolLM2, Qwen2/3, Gemma 3). Family differences are ModelConfig flags.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "edgellm/config.h"
#include "edgellm/profile.h"
#include "edgellm/session.h"
#include "edgellm/thread_pool.h"
#include "kernels/kernels.h"
#include "models/moe.h"
#include "models/weights.h"

namespace edgellm {

// cos/sin for every position of one RoPE base, [max_context][head_dim / 2] each.
struct RopeTable {
  float theta = 0.0f;
  bool scaled = false;
  std::vector<float> cos, sin;
};

// One sequence's memory: its keys and values, [layer][kv_head][max_context][head_dim],
// as `dtype` says: fp32 in k/v, bf16 bits in k16/v16, or q8_0 int8 in k8/v8
// with the half scales of each 32 elements in k_scale/v_scale
// ([layer][kv_head][max_context][head_dim / 32]); the other members are empty.
struct KvCache {
  kernels::KvDtype dtype = kernels::KvDtype::fp32;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  std::vector<int8_t> k8, v8;
  std::vector<uint16_t> k_scale, v_scale;

  // The keys / values from element `offset` on, as AttentionArgs takes them.
  const void* keys(size_t offset) const {
    switch (dtype) {
      case kernels::KvDtype::bf16:
        return k16.data() + offset;
      case kernels::KvDtype::q8_0:
        return k8.data() + offset;
      default:
        return k.data() + offset;
    }
  }
  const void* values(size_t offset) const {
    switch (dtype) {
      case kernels::KvDtype::bf16:
        return v16.data() + offset;
      case kernels::KvDtype::q8_0:
        return v8.data() + offset;
      default:
        return v.data() + offset;
    }
  }
  // q8_0: the scales of the elements from `offset` (a multiple of 32) on; else nullptr.
  const uint16_t* key_scales(size_t offset) const {
    return dtype == kernels::KvDtype::q8_0 ? k_scale.data() + offset / kernels::kKvQ8Block
                                           : nullptr;
  }
  const uint16_t* value_scales(size_t offset) const {
    return dtype == kernels::KvDtype::q8_0 ? v_scale.data() + offset / kernels::kKvQ8Block
                                           : nullptr;
  }
  // Stores `n` elements of one key and one value at element `offset`; bf16
  // rounds to nearest even, q8_0 quantizes (kernels::quantize_kv_q8_0; offset
  // and n multiples of 32).
  void store(size_t offset, const float* key, const float* value, size_t n);
};

// Activations of one forward pass, sized for the largest row count seen.
struct Scratch {
  size_t tokens = 0;
  std::vector<float> x, xn, qkv, q, attn, proj, gate_up, act, logits;
  MoeScratch moe;  // the mixture-of-experts layers'
};

// The rows of one sequence inside a forward pass: positions [start, start + n)
// of the sequence whose cache is `kv`; the last row's logits go to `logits`.
// `cache_base`: the cache slot of the sequence's position 0, so several short
// sequences can share one cache side by side (prefill_packed).
struct SequenceRows {
  KvCache* kv;
  size_t start, n;
  float* logits;
  size_t cache_base = 0;
};

// The immutable model: config, packed weights, RoPE tables. The per-sequence
// state (KvCache) and the activations (Scratch) are the caller's, so many
// sequences share one set of weights. One forward pass runs at a time (the
// thread pool takes one caller).
class Transformer {
 public:
  // `cfg` is how every kernel of every forward pass computes (the weights
  // must have been packed for cfg.isa).
  Transformer(const ModelConfig& config, ModelWeights weights, int max_context, ThreadPool& pool,
              Profiler& profiler, const kernels::ExecConfig& cfg);

  KvCache new_kv_cache() const;
  kernels::KvDtype kv_dtype() const { return cfg_.kv; }
  const kernels::ExecConfig& exec_config() const { return cfg_; }
  // Bytes of one sequence's KV cache (new_kv_cache()).
  size_t kv_cache_bytes() const;
  // Positions [start, start + n) of a cache as one flat byte string (every
  // layer's and head's keys, values and q8_0 scales, as stored), so a computed
  // prefix moves between sequences bit for bit (runtime/prefix_cache.cpp).
  size_t kv_span_bytes(size_t n) const;
  void save_kv(const KvCache& kv, size_t start, size_t n, uint8_t* out) const;
  void load_kv(KvCache& kv, size_t start, size_t n, const uint8_t* in) const;

  // Runs tokens at positions [start, start + n), appends their K/V to the
  // cache and writes the last position's logits to `logits` ([vocab]).
  void forward(KvCache& kv, Scratch& s, const int32_t* tokens, size_t n, size_t start,
               float* logits, PrefillCapture* capture);

  // Batched decode: one token per sequence (rows[i].n == 1, tokens[i]), each at
  // its own position against its own cache, in one pass over the weights. Each
  // sequence's logits are bit-identical to its own forward() of that token.
  void decode_batch(std::span<const SequenceRows> rows, Scratch& s, const int32_t* tokens);

  // Several independent sequences in one prefill (the GEMM sees every row):
  // seqs[i] runs its n tokens from position 0 against slots [cache_base,
  // cache_base + n) of one cache. Writes each sequence's last row after the
  // final norm to hidden[i * hidden_size] and, where seqs[i].logits is set
  // (all or none), its logits: the pooling of embedding and reranker models.
  void prefill_packed(std::span<const SequenceRows> seqs, Scratch& s, const int32_t* tokens,
                      size_t n, float* hidden);

  size_t decode_bytes() const { return weights_.decode_bytes; }

 private:
  // `batch`: the rows are one sequence's tokens (forward) or separate
  // sequences' decode tokens (decode_batch), see kernels::Batch.
  // `hidden`: prefill_packed's output; then only each sequence's last row is
  // normed (into row i of s.xn) and projected.
  void run(std::span<const SequenceRows> seqs, Scratch& s, const int32_t* tokens, size_t n,
           kernels::Batch batch, PrefillCapture* capture, float* hidden = nullptr);
  void ensure_scratch(Scratch& s, size_t n) const;
  void attention_block(size_t layer, Scratch& s, std::span<const SequenceRows> seqs, size_t n,
                       kernels::Batch batch);
  // The layer's feed-forward: the dense MLP, or its experts (LayerSpec::moe).
  void mlp_block(size_t layer, Scratch& s, size_t n, kernels::Batch batch);
  void dense_mlp(const LayerWeights& L, Scratch& s, size_t n, kernels::Batch batch);
  // What a block's first matmul reads: the normed rows, or the residual stream itself where
  // the family has no pre-norms (OLMo 2).
  const float* block_input(const Scratch& s) const {
    return c_.pre_norms ? s.xn.data() : s.x.data();
  }
  // x += proj (times the residual multiplier) for n rows: each block's last step.
  void add_residual(Scratch& s, size_t n);
  // prefill_packed's end: each sequence's last row normed, its logits if asked.
  void finish_packed(std::span<const SequenceRows> seqs, Scratch& s, float* hidden);
  // Granite's logit divisor, then the final softcap, in place.
  void finish_logits(float* logits, size_t n) const;
  // fn(t) for each of n tokens: split across the pool for a prefill, inline for
  // the few rows of a decode step (a dispatch costs more than their work). Each
  // token's arithmetic is the same either way.
  template <typename Fn>
  void for_tokens(size_t n, Fn&& fn) {
    if (n < kParallelTokens) {
      for (size_t t = 0; t < n; ++t) fn(t);
      return;
    }
    pool_.parallel_chunks(n, [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) fn(t);
    });
  }
  // A batched decode step (<= 32 streams) stays inline.
  static constexpr size_t kParallelTokens = 32;

  const ModelConfig& c_;
  ModelWeights weights_;
  size_t max_context_;
  kernels::ExecConfig cfg_;
  ThreadPool& pool_;
  Profiler& prof_;

  std::vector<RopeTable> rope_tables_;
  std::vector<const RopeTable*> layer_rope_;  // per layer
};

}  // namespace edgellm
