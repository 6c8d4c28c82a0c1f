// The mixture-of-experts feed-forward (ModelConfig::moe): routing as transformers'
// Qwen3MoeSparseMoeBlock / OlmoeSparseMoeBlock / GraniteMoeTopKGating compute it, and the
// experts run as one matmul per expert over the tokens routed to it.
#pragma once

#include <cstddef>
#include <vector>

#include "edgellm/config.h"
#include "edgellm/profile.h"
#include "edgellm/thread_pool.h"
#include "kernels/kernels.h"
#include "models/weights.h"

namespace edgellm {

// One of the experts a token is routed to.
struct Route {
  int expert = 0;
  float weight = 0.0f;
};

// A token's routes from its router logits ([num_experts]): softmax over the experts in
// fp32, the k largest probabilities (largest first; equal ones lowest index first, where
// torch.topk leaves the order of ties unspecified), divided by their sum when `renormalize`.
void route_token(const float* logits, size_t num_experts, size_t k, bool renormalize,
                 Route* routes);
// GraniteMoE's and gpt-oss's routes (MoeSpec::Routing::topk_then_softmax): the k largest
// logits (largest first, ties as above), weighted by a softmax over those k alone.
void route_token_topk_softmax(const float* logits, size_t num_experts, size_t k, Route* routes);

// Buffers of one MoE block, sized for the largest row count seen.
struct MoeScratch {
  std::vector<float> router;                // [n, num_experts]
  std::vector<Route> routes;                // [n, k]
  std::vector<size_t> rows;                 // the rows routed to one expert
  std::vector<float> weights;               // and their routing weights
  std::vector<float> x, gate_up, act, out;  // that expert's gathered rows, its MLP, its output
  std::vector<float> shared_gate;           // [n] Qwen2-MoE's shared-expert gate logits
};

// out[t] = sum over token t's routes of weight * expert(xn[t]) for n rows of [hidden],
// each token's experts added in ascending expert order (HF's index_add_ order), plus the
// shared MLP's output where there is one (GraniteMoeShared: moe + shared_mlp(xn); Qwen2-MoE:
// moe + sigmoid(shared_expert_gate(xn)) * shared_expert(xn)). Every
// expert with tokens runs one gate_up and one down matmul over them (`batch` as the
// forward pass's: a decode batch keeps each row its own GEMV's, bit for bit).
void moe_feed_forward(const LayerWeights& L, const ModelConfig& c, const float* xn, size_t n,
                      float* out, MoeScratch& s, ThreadPool& pool, const kernels::ExecConfig& cfg,
                      kernels::Batch batch, Profiler& prof);

}  // namespace edgellm
