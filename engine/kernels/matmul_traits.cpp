// The matmul type-traits table (kernels.h MatmulKernels): one row per weight
// format and tier, naming the kernels of that layout, as ggml's
// type_traits_cpu does. A matrix takes its row once, when it is packed, from
// the tier the model runs at; matmul() below is the one dispatcher.
//
// Adding a weight format: a kernel file (its gemv / gemm / rows, unpack_row
// and bytes, with a scalar reference), a WeightFormat value, a pack function
// that sets PackedMatrix::kernels, and its rows here (docs/adding_a_model.md).
// A tier without a row of its own runs the best lower one.
//
// Compiled without ISA flags, like dispatch.cpp: rows only name functions of
// the ISA files, and matmul_kernels() never hands out a row above runnable_isa().
#include <algorithm>
#include <stdexcept>

#include "edgellm/bf16.h"
#include "kernels/avx2.h"
#include "kernels/avx512.h"
#include "kernels/kernels.h"
#include "kernels/matmul_rows_avx512.h"
#include "kernels/quant.h"

namespace edgellm::kernels {

namespace {

// --- bf16 ---------------------------------------------------------------------

// Scalar matmul over output rows [r0, r1): the reference's arithmetic on a
// row range, so the pool can split it without copying the matrix.
void scalar_rows(const PackedMatrix& w, const float* x, size_t n, float* y, size_t r0, size_t r1) {
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

void bf16_scalar(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                 const ExecConfig&) {
  pool.parallel_chunks(w.rows, [&](size_t r0, size_t r1) { scalar_rows(w, x, n, y, r0, r1); });
}

// A layout whose GEMM is its GEMV per token: one n == 1 call per row is
// identical to it by definition.
void bf16_scalar_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                      const ExecConfig& cfg) {
  for (size_t t = 0; t < n; ++t) bf16_scalar(w, x + t * w.cols, 1, y + t * w.rows, pool, cfg);
}

void bf16_avx2(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
               const ExecConfig&) {
  avx2::matmul(w, x, n, y, pool);
}
void bf16_avx2_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                    const ExecConfig&) {
  avx2::matmul_rows(w, x, n, y, pool);
}
void bf16_avx512(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                 const ExecConfig& cfg) {
  avx512::matmul(w, x, n, y, pool, cfg.gemm);
}
// The avx512 and amx layouts are one; their n == 1 GEMV is avx512's (amx
// starts at kMinTokens), so the batch follows that GEMV's order.
void bf16_vnni_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                    const ExecConfig&) {
  avx512::matmul_rows_vnni(w, x, n, y, pool);
}
void bf16_amx(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
              const ExecConfig& cfg) {
  amx::matmul(w, x, n, y, pool, cfg.gemm);
}

void bf16_unpack_scalar(const PackedMatrix& w, size_t r, float* out) {
  const uint16_t* row = w.data.data() + w.offset + r * w.cols;
  for (size_t c = 0; c < w.cols; ++c) out[c] = bf16_to_float(row[c]);
}
size_t bf16_bytes_scalar(const PackedMatrix& w) {
  return w.rows * w.cols * sizeof(uint16_t);
}
size_t bf16_bytes_avx2(const PackedMatrix& w) {
  return (w.rows + avx2::kPanelRows - 1) / avx2::kPanelRows * avx2::kPanelRows * w.cols *
         sizeof(uint16_t);
}
size_t bf16_bytes_vnni(const PackedMatrix& w) {
  return vnni::panels(w.rows) * vnni::kPanelRows * vnni::padded_cols(w.cols) * sizeof(uint16_t);
}

// --- quantized (GGUF blocks as i8 / u4 / u5 segments) ----------------------------

// The tier is the row's; the activation precision (cfg.quant) picks fp32 or
// int8 activations inside quant_matmul (kernels/quant.h).
template <Isa T>
void quant_gemm(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                const ExecConfig& cfg) {
  quant_matmul(*w.quant, x, n, y, w.bias, pool, T, cfg.quant);
}
// y[t][r] += bias[r] for the kernels that take no bias themselves.
void add_bias(const PackedMatrix& w, size_t n, float* y) {
  if (const float* bias = w.bias)
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += bias[r];
}
// The avx512 and amx tiers under the fast GEMM precision (bf16) with fp32
// quantized activations: prefill rounds x to bf16 once, VDPBF16PS per group
// (quant_bf16_avx512.cpp) or one TDPBF16PS pass (quant_amx.cpp); below 16
// tokens (decode, short prompts) u4 and u5 blocks take the bf16 GEMV
// (quant_gemv_bf16_avx512.cpp); weights, scales and mins exact. Otherwise
// quant_gemm.
template <Isa T>
void quant_gemm_bf16(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                     const ExecConfig& cfg) {
  if (quant_prefill_in_bf16(cfg, n)) {
    if constexpr (T == Isa::amx)
      amx::quant_matmul_bf16(*w.quant, x, n, y, pool);
    else
      avx512::quant_matmul_bf16(*w.quant, x, n, y, pool);
  } else if (quant_decode_in_bf16(cfg)) {
    avx512::quant_gemv_bf16(*w.quant, x, n, y, pool);
  } else {
    return quant_gemm<T>(w, x, n, y, pool, cfg);
  }
  add_bias(w, n, y);
}
// Batched decode: each token its own GEMV (quant_gemv_bf16 is per token too).
template <Isa T>
void quant_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                const ExecConfig& cfg) {
  if (T < Isa::avx512 || !quant_decode_in_bf16(cfg))
    return quant_matmul_rows(*w.quant, x, n, y, w.bias, pool, T, cfg.quant);
  avx512::quant_gemv_bf16(*w.quant, x, n, y, pool);
  add_bias(w, n, y);
}
void quant_unpack(const PackedMatrix& w, size_t r, float* out) {
  dequant_row(*w.quant, r, out);
}
size_t quant_bytes(const PackedMatrix& w) {
  return w.quant->bytes();
}

template <Isa T>
constexpr MatmulKernels quant_row() {
  constexpr MatmulFn fast = T >= Isa::avx512 ? quant_gemm_bf16<T> : quant_gemm<T>;
  return {WeightFormat::quant, T, fast, fast, quant_rows<T>, quant_unpack, quant_bytes};
}

}  // namespace

const std::vector<MatmulKernels>& matmul_kernel_table() {
  constexpr Isa S = Isa::scalar, A2 = Isa::avx2, A5 = Isa::avx512, AMX = Isa::amx;
  constexpr WeightFormat B = WeightFormat::bf16;
  // format, tier, gemv, gemm, rows, unpack_row, bytes
  static const std::vector<MatmulKernels> table = {
      {B, S, bf16_scalar, bf16_scalar, bf16_scalar_rows, bf16_unpack_scalar, bf16_bytes_scalar},
      {B, A2, bf16_avx2, bf16_avx2, bf16_avx2_rows, avx2::unpack_row, bf16_bytes_avx2},
      {B, A5, bf16_avx512, bf16_avx512, bf16_vnni_rows, vnni::unpack_row, bf16_bytes_vnni},
      {B, AMX, bf16_avx512, bf16_amx, bf16_vnni_rows, vnni::unpack_row, bf16_bytes_vnni},
      quant_row<S>(),
      quant_row<A2>(),
      quant_row<A5>(),
      quant_row<AMX>(),
  };
  return table;
}

const MatmulKernels& matmul_kernels(WeightFormat format, Isa tier) {
  const MatmulKernels* best = nullptr;
  for (const MatmulKernels& k : matmul_kernel_table())
    if (k.format == format && k.tier <= std::min(tier, runnable_isa()) &&
        (!best || k.tier > best->tier))
      best = &k;
  if (!best) throw std::logic_error("matmul_kernels: no scalar row for a weight format");
  return *best;
}

std::string_view weight_format_name(WeightFormat f) {
  return f == WeightFormat::quant ? "quant" : "bf16";
}

Bias::Bias(std::vector<float> owned)
    : owned_(std::make_shared<const std::vector<float>>(std::move(owned))),
      data_(owned_->empty() ? nullptr : owned_->data()) {}

PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols, Isa isa) {
  PackedMatrix m;
  const Isa tier = std::min(isa, runnable_isa());
  switch (tier) {
    case Isa::amx:
    case Isa::avx512:
      vnni::pack(bf16_row_major, rows, cols, tier, m);
      break;
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
  m.kernels = &matmul_kernels(WeightFormat::bf16, m.isa);
  return m;
}

PackedMatrix pack_matrix(const uint16_t* bf16_row_major, size_t rows, size_t cols) {
  return pack_matrix(bf16_row_major, rows, cols, active_isa());
}

PackedMatrix pack_quant(std::shared_ptr<const QuantMatrix> q, Isa isa) {
  PackedMatrix m;
  m.rows = q->rows;
  m.cols = q->cols;
  m.isa = std::min(isa, runnable_isa());
  m.kernels = &matmul_kernels(WeightFormat::quant, m.isa);
  m.quant = std::move(q);
  return m;
}

void unpack_row(const PackedMatrix& w, size_t r, float* out) {
  w.kernels->unpack_row(w, r, out);
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
            const ExecConfig& cfg, Batch batch) {
  const MatmulKernels& k = *w.kernels;
  if (n == 1) return k.gemv(w, x, n, y, pool, cfg);
  (batch == Batch::independent ? k.rows : k.gemm)(w, x, n, y, pool, cfg);
}

void matmul(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  matmul(w, x, n, y, pool, process_exec_config());
}

void matmul_rows(const PackedMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool) {
  matmul(w, x, n, y, pool, process_exec_config(), Batch::independent);
}

}  // namespace edgellm::kernels
