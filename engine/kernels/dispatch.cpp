// Routes each kernel to the active ISA's implementation. Today only the scalar
// reference exists here; SIMD files register beside it.
#include <cstdlib>
#include <cstring>

#include "kernels/kernels.h"

namespace edgellm::kernels {

namespace {
Isa initial_isa() {
  const char* env = std::getenv("EDGELLM_ISA");
  if (env && std::strcmp(env, "scalar") == 0) return Isa::scalar;
  return detect_isa();
}
Isa g_isa = initial_isa();
}  // namespace

std::string_view isa_name(Isa isa) { return isa == Isa::avx2 ? "avx2" : "scalar"; }
Isa detect_isa() { return Isa::scalar; }
Isa active_isa() { return g_isa; }
void set_isa(Isa isa) { g_isa = isa; }

PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols) {
  PackedMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.isa = Isa::scalar;
  m.data.assign(bf16_row_major, bf16_row_major + rows * cols);
  return m;
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  // Split output rows across threads; each chunk is an independent row block.
  pool.parallel_chunks(w.rows, [&](size_t r0, size_t r1) {
    if (r0 == r1) return;
    PackedMatrix view;  // scalar layout is row-major, so a row block is a slice
    view.rows = r1 - r0;
    view.cols = w.cols;
    view.data.assign(w.data.begin() + static_cast<std::ptrdiff_t>(r0 * w.cols),
                     w.data.begin() + static_cast<std::ptrdiff_t>(r1 * w.cols));
    view.bias = w.bias ? w.bias + r0 : nullptr;
    std::vector<float> block(n * view.rows);
    ref::matmul(view, x, n, block.data());
    for (size_t t = 0; t < n; ++t)
      std::memcpy(y + t * w.rows + r0, block.data() + t * view.rows, view.rows * sizeof(float));
  });
}

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y) {
  ref::rmsnorm(x, weight, dim, eps, y);
}
void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin) {
  ref::rope(x, n_heads, head_dim, cos, sin);
}
void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  ref::silu_mul(gate, up, n, out);
}
void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out) {
  ref::gelu_tanh_mul(gate, up, n, out);
}
void add(float* acc, const float* x, size_t n) { ref::add(acc, x, n); }
void attention(const AttentionArgs& args, ThreadPool&) { ref::attention(args); }
void top_k(const float* x, size_t n, size_t k, int32_t* out_indices) {
  ref::top_k(x, n, k, out_indices);
}

}  // namespace edgellm::kernels
