// The kernel interface the forward pass calls. Kernels know nothing of models.
//
// Every kernel has a scalar reference in namespace `ref` (kernels/reference.cpp),
// always built, used by the unit tests as ground truth and selectable at run
// time (EDGELLM_ISA=scalar). The dispatching functions below route to the
// fastest path the CPU supports; each ISA lives in its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "edgellm/thread_pool.h"

namespace edgellm::kernels {

enum class Isa { scalar, avx2 };
std::string_view isa_name(Isa isa);

// What the engine registers: each kernel and the ISA paths it has. The kernel
// registry (kernel_registry/supported_kernels.md) is tested against this list.
struct KernelInfo {
  std::string_view name;
  std::vector<Isa> paths;
};
const std::vector<KernelInfo>& registered_kernels();
Isa detect_isa();       // best ISA this CPU supports (cpuid)
Isa active_isa();       // detect_isa() unless overridden
void set_isa(Isa isa);  // tests and EDGELLM_ISA=scalar|avx2; clamped to detect_isa()

// A bf16 weight matrix W[rows][cols], laid out once at setup for the matmul of
// the ISA active at packing time. `data` owns the packed copy; the layout
// starts at data[offset] (the AVX2 layout pads `data` to start on a 64-byte
// boundary). Isa::scalar is plain row-major; Isa::avx2 is row panels, see
// kernels/avx2.h. matmul() follows `isa`, whatever the active ISA is now.
struct QuantMatrix;  // kernels/quant.h
struct PackedMatrix {
  size_t rows = 0, cols = 0;
  Isa isa = Isa::scalar;
  std::vector<uint16_t> data;
  size_t offset = 0;
  const float* bias = nullptr;  // optional [rows], not owned
  // Quantized (GGUF) weights instead of bf16: matmul and unpack_row use them
  // (kernels/quant.h); shared when the embedding is also the LM head.
  std::shared_ptr<const QuantMatrix> quant;
};
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols);
// Packs for a given ISA (tests, benchmarks); one the CPU lacks falls back to detect_isa().
PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa);
// Row r of W as fp32, whatever the layout (tied embeddings, tests).
void unpack_row(const PackedMatrix& w, size_t r, float* out);

// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]) for t < n. n == 1 is decode's GEMV.
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool);

// y = x / sqrt(mean(x^2) + eps) * weight, over `dim` elements (x may alias y).
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);

// Rotates each of n_heads vectors of length head_dim in place (HF rotate_half
// layout: pairs are (i, i + head_dim/2)). cos/sin hold head_dim/2 values.
void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin);

// out = act(gate) * up, element-wise.
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);

// acc += x
void add(float* acc, const float* x, size_t n);

// Causal multi-head attention with grouped KV heads, for `n` query tokens at
// positions [start, start + n). The cache holds positions [0, start + n):
// k_cache/v_cache are [n_kv_heads][cache_stride][head_dim]. q and out are
// [n][n_heads][head_dim]. window > 0 keeps only keys with q_pos - k_pos < window.
struct AttentionArgs {
  const float* q = nullptr;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  float* out = nullptr;
  size_t n = 0, start = 0;
  size_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  size_t cache_stride = 0;
  size_t window = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = off; else logits = softcap * tanh(logits / softcap)
};
void attention(const AttentionArgs& args, ThreadPool& pool);

// Indices of the k largest values, largest first; ties toward the smaller index.
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);

namespace ref {
void matmul(const PackedMatrix& w, const float* x, size_t n, float* y);
void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y);
void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin);
void silu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out);
void add(float* acc, const float* x, size_t n);
void attention(const AttentionArgs& args);
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices);
}  // namespace ref

}  // namespace edgellm::kernels
