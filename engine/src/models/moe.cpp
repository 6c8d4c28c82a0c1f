#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fault_injection.h"

namespace edgellm {

void route_token(const float* logits, size_t num_experts, size_t k, bool renormalize,
                 Route* routes) {
  // F.softmax(router_logits, dim=1, dtype=torch.float): max-subtracted exponentials.
  float max = logits[0];
  for (size_t e = 1; e < num_experts; ++e) max = std::max(max, logits[e]);
  std::vector<float> p(num_experts);
  float sum = 0.0f;
  for (size_t e = 0; e < num_experts; ++e) {
    p[e] = std::exp(logits[e] - max);
    sum += p[e];
  }
  for (float& v : p) v /= sum;
  // torch.topk(routing_weights, k): the k largest, largest first.
  std::vector<int> order(num_experts);
  for (size_t e = 0; e < num_experts; ++e) order[e] = static_cast<int>(e);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float top = 0.0f;
  for (size_t i = 0; i < k; ++i) {
    routes[i] = {order[i], p[order[i]]};
    top += routes[i].weight;
  }
  // routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
  if (renormalize)
    for (size_t i = 0; i < k; ++i) routes[i].weight /= top;
}

void route_token_topk_softmax(const float* logits, size_t num_experts, size_t k, Route* routes) {
  // logits.topk(top_k): the k largest, largest first.
  std::vector<int> order(num_experts);
  for (size_t e = 0; e < num_experts; ++e) order[e] = static_cast<int>(e);
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  // softmax over the k: the largest comes first, so it is the max (fp32).
  const float max = logits[order[0]];
  float sum = 0.0f;
  for (size_t i = 0; i < k; ++i) {
    routes[i] = {order[i], std::exp(logits[order[i]] - max)};
    sum += routes[i].weight;
  }
  for (size_t i = 0; i < k; ++i) routes[i].weight /= sum;
}

namespace {

// out = down(act(gate) * up) for m rows of x (a SwiGLU / GeGLU MLP whose gate_up rows are
// [gate; up]): an expert's, or the shared MLP's.
void glu_mlp(const kernels::PackedMatrix& gate_up, const kernels::PackedMatrix& down,
             const ModelConfig& c, const float* x, size_t m, float* out, MoeScratch& s,
             ThreadPool& pool, const kernels::ExecConfig& cfg, kernels::Batch batch,
             Profiler& prof) {
  const size_t X = down.cols;
  s.gate_up.resize(m * 2 * X);
  s.act.resize(m * X);
  {
    Profiler::Scope z(prof, Zone::gate_up_proj, static_cast<double>(gate_up.byte_size()),
                      2.0 * m * gate_up.rows * gate_up.cols);
    kernels::matmul(gate_up, x, m, s.gate_up.data(), pool, cfg, batch);
  }
  {
    Profiler::Scope z(prof, Zone::activation);
    for (size_t i = 0; i < m; ++i) {
      const float* gate = &s.gate_up[i * 2 * X];
      if (c.hidden_act == Activation::silu)
        kernels::silu_mul(gate, gate + X, X, &s.act[i * X], cfg.isa);
      else if (c.hidden_act == Activation::swiglu_oai)
        kernels::swiglu_oai_mul(gate, gate + X, X, c.swiglu_limit, &s.act[i * X], cfg.isa);
      else
        kernels::gelu_tanh_mul(gate, gate + X, X, &s.act[i * X], cfg.isa);
    }
  }
  {
    Profiler::Scope z(prof, Zone::down_proj, static_cast<double>(down.byte_size()),
                      2.0 * m * down.rows * down.cols);
    kernels::matmul(down, s.act.data(), m, out, pool, cfg, batch);
  }
}

}  // namespace

void moe_feed_forward(const LayerWeights& L, const ModelConfig& c, const float* xn, size_t n,
                      float* out, MoeScratch& s, ThreadPool& pool, const kernels::ExecConfig& cfg,
                      kernels::Batch batch, Profiler& prof) {
  const size_t H = c.hidden_size, E = c.moe.num_experts, k = c.moe.experts_per_token;
  s.router.resize(n * E);
  s.routes.resize(n * k);
  {
    Profiler::Scope z(prof, Zone::router, static_cast<double>(L.router.byte_size()),
                      2.0 * n * E * H);
    kernels::matmul(L.router, xn, n, s.router.data(), pool, cfg, batch);
    const bool topk_softmax =
        c.moe.routing == MoeSpec::Routing::topk_then_softmax &&
        kernels::fault::active() != kernels::fault::Fault::moe_softmax_over_all_experts;
    for (size_t t = 0; t < n; ++t) {
      if (topk_softmax)
        route_token_topk_softmax(&s.router[t * E], E, k, &s.routes[t * k]);
      else
        route_token(&s.router[t * E], E, k, c.moe.norm_topk_prob, &s.routes[t * k]);
    }
  }
  std::fill(out, out + n * H, 0.0f);
  for (size_t e = 0; e < E; ++e) {
    s.rows.clear();
    s.weights.clear();
    for (size_t t = 0; t < n; ++t)
      for (size_t i = 0; i < k; ++i)
        if (s.routes[t * k + i].expert == static_cast<int>(e)) {
          s.rows.push_back(t);
          s.weights.push_back(s.routes[t * k + i].weight);
        }
    const size_t m = s.rows.size();
    if (m == 0) continue;  // an expert no token chose is never read
    s.x.resize(m * H);
    s.out.resize(m * H);
    for (size_t i = 0; i < m; ++i) std::memcpy(&s.x[i * H], &xn[s.rows[i] * H], H * sizeof(float));
    glu_mlp(L.expert_gate_up[e], L.expert_down[e], c, s.x.data(), m, s.out.data(), s, pool, cfg,
            batch, prof);
    // HF: expert(x) * routing_weight, then index_add_ into the token's row (gpt-oss: the
    // expert's down_proj bias is in `out` already, added before the weight as HF adds it).
    for (size_t i = 0; i < m; ++i) {
      float* y = &out[s.rows[i] * H];
      const float* o = &s.out[i * H];
      for (size_t j = 0; j < H; ++j) {
        const float weighted = o[j] * s.weights[i];
        y[j] += weighted;
      }
    }
  }
  if (c.moe.shared_intermediate_size == 0) return;
  // GraniteMoeShared: moe_hidden_states + shared_mlp(hidden_states), every row; Qwen2-MoE
  // scales each row's shared output by F.sigmoid(shared_expert_gate(hidden_states)) first.
  s.out.resize(n * H);
  glu_mlp(L.gate_up, L.down, c, xn, n, s.out.data(), s, pool, cfg, batch, prof);
  if (c.moe.shared_expert_gate) {
    s.shared_gate.resize(n);
    kernels::matmul(L.shared_expert_gate, xn, n, s.shared_gate.data(), pool, cfg, batch);
    for (size_t t = 0; t < n; ++t) {
      const float g = 1.0f / (1.0f + std::exp(-s.shared_gate[t]));
      for (size_t j = 0; j < H; ++j) s.out[t * H + j] *= g;
    }
  }
  for (size_t i = 0; i < n * H; ++i) out[i] += s.out[i];
}

}  // namespace edgellm
