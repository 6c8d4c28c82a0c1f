// Routes each kernel to the active ISA's implementation. The ISA is detected
// once from cpuid (EDGELLM_ISA=scalar|avx2 overrides it, clamped to what the
// CPU supports); set_isa() switches it for tests. A new ISA adds an enum
// value, a file of kernels and a case in each switch below.
//
// This file is compiled without ISA flags, so it runs on any x86-64 (and
// other architectures) and must not use SIMD intrinsics itself.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "edgellm/bf16.h"
#include "kernels/avx2.h"
#include "kernels/kernels.h"
#include "kernels/matmul_rows_avx512.h"

namespace edgellm::kernels {

namespace {

Isa clamp_to_cpu(Isa isa) {
  return static_cast<int>(isa) <= static_cast<int>(detect_isa()) ? isa : detect_isa();
}

Isa initial_isa() {
  const char* env = std::getenv("EDGELLM_ISA");
  if (env == nullptr || *env == '\0') return detect_isa();
  if (std::strcmp(env, "scalar") == 0) return Isa::scalar;
  if (std::strcmp(env, "avx2") == 0) {
    if (detect_isa() != Isa::avx2)
      std::fprintf(stderr, "edgellm: EDGELLM_ISA=avx2 but this CPU lacks AVX2/FMA/F16C; using %s\n",
                   std::string(isa_name(detect_isa())).c_str());
    return clamp_to_cpu(Isa::avx2);
  }
  std::fprintf(stderr, "edgellm: ignoring unknown EDGELLM_ISA=%s (expected scalar or avx2)\n", env);
  return detect_isa();
}

// Initialised on first use, so kernels called from other static
// initialisers see the detected ISA, not a zero-initialised one.
std::atomic<Isa>& isa_slot() {
  static std::atomic<Isa> slot{initial_isa()};
  return slot;
}

// Scalar matmul over output rows [r0, r1): the reference's arithmetic on a
// row range, so the pool can split it without copying the matrix.
void scalar_matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, size_t r0,
                        size_t r1) {
  const uint16_t* base = w.data.data() + w.offset;
  for (size_t t = 0; t < n; ++t) {
    const float* xt = x + t * w.cols;
    for (size_t r = r0; r < r1; ++r) {
      const uint16_t* row = base + r * w.cols;
      float acc = 0.0f;
      for (size_t c = 0; c < w.cols; ++c) acc += bf16_to_float(row[c]) * xt[c];
      y[t * w.rows + r] = acc + (w.bias ? w.bias[r] : 0.0f);
    }
  }
}

}  // namespace

std::string_view isa_name(Isa isa) {
  return isa == Isa::avx2 ? "avx2" : "scalar";
}

const std::vector<KernelInfo>& registered_kernels() {
  static const std::vector<KernelInfo> kernels = {
      {"matmul", {Isa::scalar, Isa::avx2}},   {"attention", {Isa::scalar, Isa::avx2}},
      {"rmsnorm", {Isa::scalar, Isa::avx2}},  {"rope", {Isa::scalar, Isa::avx2}},
      {"silu_mul", {Isa::scalar, Isa::avx2}}, {"gelu_tanh_mul", {Isa::scalar, Isa::avx2}},
      {"add", {Isa::scalar, Isa::avx2}},      {"top_k", {Isa::scalar, Isa::avx2}},
  };
  return kernels;
}

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  static const Isa best = [] {
    // __builtin_cpu_supports("avx2") also checks that the OS saves YMM state.
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    return avx2 ? Isa::avx2 : Isa::scalar;
  }();
  return best;
#else
  return Isa::scalar;
#endif
}

Isa active_isa() {
  return isa_slot().load(std::memory_order_relaxed);
}
void set_isa(Isa isa) {
  isa_slot().store(clamp_to_cpu(isa), std::memory_order_relaxed);
}

PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa) {
  PackedMatrix m;
  switch (clamp_to_cpu(isa)) {
    case Isa::avx2:
      avx2::pack(bf16_row_major, rows, cols, m);
      break;
    case Isa::scalar:
      m.rows = rows;
      m.cols = cols;
      m.isa = Isa::scalar;
      m.data.assign(bf16_row_major, bf16_row_major + rows * cols);
      break;
  }
  return m;
}

PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols) {
  return pack_matrix(bf16_row_major, rows, cols, active_isa());
}

void unpack_row(const PackedMatrix& w, size_t r, float* out) {
  if (w.isa == Isa::avx2) return avx2::unpack_row(w, r, out);
  const uint16_t* row = w.data.data() + w.offset + r * w.cols;
  for (size_t c = 0; c < w.cols; ++c) out[c] = bf16_to_float(row[c]);
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  // The layout decides, not the active ISA: a matrix packed for AVX2 stays
  // valid (the CPU has AVX2) after set_isa(scalar).
  if (w.isa == Isa::avx2) return avx2::matmul(w, x, n, y, pool);
  pool.parallel_chunks(w.rows,
                       [&](size_t r0, size_t r1) { scalar_matmul_rows(w, x, n, y, r0, r1); });
}

void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  if (w.isa == Isa::avx2)
    return avx512::available() ? avx512::matmul_rows(w, x, n, y, pool)
                               : avx2::matmul_rows(w, x, n, y, pool);
  // Any other layout: one n == 1 call per row is identical by definition.
  for (size_t t = 0; t < n; ++t) matmul(w, x + t * w.cols, 1, y + t * w.rows, pool);
}

void rmsnorm(const float* x, const float* weight, size_t dim, float eps, float* y) {
  if (active_isa() == Isa::avx2) return avx2::rmsnorm(x, weight, dim, eps, y);
  ref::rmsnorm(x, weight, dim, eps, y);
}

void rope(float* x, size_t n_heads, size_t head_dim, const float* cos, const float* sin) {
  if (active_isa() == Isa::avx2) return avx2::rope(x, n_heads, head_dim, cos, sin);
  ref::rope(x, n_heads, head_dim, cos, sin);
}

void silu_mul(const float* gate, const float* up, size_t n, float* out) {
  if (active_isa() == Isa::avx2) return avx2::silu_mul(gate, up, n, out);
  ref::silu_mul(gate, up, n, out);
}

void gelu_tanh_mul(const float* gate, const float* up, size_t n, float* out) {
  if (active_isa() == Isa::avx2) return avx2::gelu_tanh_mul(gate, up, n, out);
  ref::gelu_tanh_mul(gate, up, n, out);
}

void add(float* acc, const float* x, size_t n) {
  if (active_isa() == Isa::avx2) return avx2::add(acc, x, n);
  ref::add(acc, x, n);
}

void attention(const AttentionArgs& args, ThreadPool& pool) {
  // The AVX2 path works on whole vectors of head_dim; others take the reference.
  if (active_isa() == Isa::avx2 && args.head_dim % 8 == 0) return avx2::attention(args, pool);
  ref::attention(args);
}

void top_k(const float* x, size_t n, size_t k, int32_t* out_indices) {
  if (active_isa() == Isa::avx2) return avx2::top_k(x, n, k, out_indices);
  ref::top_k(x, n, k, out_indices);
}

}  // namespace edgellm::kernels
