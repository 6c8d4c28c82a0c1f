// Quantized matmul: the activation precision switch, the scalar references of
// both precisions, activation quantization and the dispatch to the ISA's row
// kernel (kernels/quant.h).
//
// fp32 activations, per output y[t][r] and block b of 32 columns:
//   scale_b * sum_j (q_j - zero) x_j + min_b * sum(x_b)  (per 16-group for Q6_K,
//   Q3_K, Q2_K; mins per 16 take the sums of x per 16)
//
// int8 activations, per output y[t][r] and block b, with integer dot products
//   i8:  scale_g * sx_b * sum(q * xq) + min_g * sum(x_g)  (per 16-group as above)
//   u4, u5:  scale_b * sx_b * (sum(q * xq) - zero * sum(xq)) + min_b * sum(x_b)
//   c4:  scale_b * sx_b * sum(codebook[q] * xq)
// The SIMD paths compute the same integer sums; only the fp32 accumulation
// order differs.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace edgellm::kernels {

namespace {

std::atomic<QuantPrecision>& quant_precision_slot() {
  static std::atomic<QuantPrecision> slot{QuantPrecision::fp32};
  return slot;
}

void resize_acts(size_t n, size_t cols, QuantizedActs& a) {
  const size_t nb = cols / 32;
  a.n = n;
  a.cols = cols;
  a.q.resize(n * cols);
  a.scale.resize(n * nb);
  a.sum.resize(n * nb);
  a.qsum.resize(n * nb);
  a.scaled_qsum.resize(n * nb);
  a.half_sum.resize(2 * n * nb);
}

// Blocks [i0, i1) of the n * cols / 32 blocks of x.
void quantize_blocks(const float* x, QuantizedActs& a, size_t i0, size_t i1) {
  for (size_t i = i0; i < i1; ++i) {
    const float* v = x + i * 32;
    int8_t* q = a.q.data() + i * 32;
    float amax = 0.0f, sum = 0.0f, half[2] = {0.0f, 0.0f};
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(v[j]));
      sum += v[j];
      half[j / 16] += v[j];
    }
    // +-127, never -128: the AVX2 path negates xq (sign trick).
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t qsum = 0;
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<int8_t>(std::nearbyint(v[j] * id));
      qsum += q[j];
    }
    a.scale[i] = d;
    a.sum[i] = sum;
    a.half_sum[2 * i] = half[0];
    a.half_sum[2 * i + 1] = half[1];
    a.qsum[i] = qsum;
    a.scaled_qsum[i] = d * static_cast<float>(qsum);
  }
}

}  // namespace

std::string_view quant_precision_name(QuantPrecision p) {
  return p == QuantPrecision::int8 ? "int8" : "fp32";
}
std::optional<QuantPrecision> parse_quant_precision(std::string_view name) {
  for (QuantPrecision p : {QuantPrecision::fp32, QuantPrecision::int8})
    if (quant_precision_name(p) == name) return p;
  return std::nullopt;
}
QuantPrecision quant_precision() {
  return quant_precision_slot().load(std::memory_order_relaxed);
}
void set_quant_precision(QuantPrecision p) {
  quant_precision_slot().store(p, std::memory_order_relaxed);
}

void block_sums(const float* x, size_t n, size_t cols, float* out, size_t group) {
  for (size_t i = 0; i < n * (cols / group); ++i) {
    float sum = 0.0f;
    for (size_t j = 0; j < group; ++j) sum += x[i * group + j];
    out[i] = sum;
  }
}

void quantize_acts(const float* x, size_t n, size_t cols, QuantizedActs& a) {
  resize_acts(n, cols, a);
  quantize_blocks(x, a, 0, n * (cols / 32));
}

namespace ref {

void quant_rows_fp32(const QuantSegment& s, const Fp32Acts& a, float* y, size_t ldy, size_t r0,
                     size_t r1) {
  const size_t nb = s.cols / 32;
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* wq = s.qs.data() + r * s.row_bytes();
    const size_t g0 = r * (s.cols / s.group);  // first scale of the row (u4, u5: group 32)
    for (size_t t = 0; t < a.n; ++t) {
      const float* x = a.x + t * s.cols;
      float acc = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        const float* xb = x + b * 32;
        if (s.layout == QuantLayout::i8) {
          float lo = 0.0f, hi = 0.0f;  // the two halves: Q6_K scales per 16
          for (int j = 0; j < 16; ++j) {
            lo += static_cast<float>(static_cast<int8_t>(wq[b * 32 + j])) * xb[j];
            hi += static_cast<float>(static_cast<int8_t>(wq[b * 32 + 16 + j])) * xb[16 + j];
          }
          if (s.group == 16)
            acc += s.scale(g0 + 2 * b) * lo + s.scale(g0 + 2 * b + 1) * hi;
          else
            acc += s.scale(g0 + b) * (lo + hi);
          if (s.mins_per_16())
            acc += s.min(g0 + 2 * b) * a.half_sum[t * 2 * nb + 2 * b] +
                   s.min(g0 + 2 * b + 1) * a.half_sum[t * 2 * nb + 2 * b + 1];
          else if (s.has_min)
            acc += s.min(g0 + b) * a.block_sum[t * nb + b];
        } else {  // u4, u5, c4: elements j and j + 16 side by side, as the nibbles pair them
          const uint8_t* blk = wq + b * layout_block_bytes(s.layout);
          float dot = 0.0f;
          for (size_t j = 0; j < 16; ++j)
            dot += static_cast<float>(s.value(blk, j)) * xb[j] +
                   static_cast<float>(s.value(blk, j + 16)) * xb[16 + j];
          acc += s.scale(g0 + b) * dot;
          if (s.has_min) acc += s.min(g0 + b) * a.block_sum[t * nb + b];
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

void quant_rows(const QuantSegment& s, const QuantizedActs& a, float* y, size_t ldy, size_t r0,
                size_t r1) {
  const size_t nb = s.cols / 32;
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* wq = s.qs.data() + r * s.row_bytes();
    const size_t g0 = r * (s.cols / s.group);  // first scale of the row (u4, u5: group 32)
    auto scales = [&](size_t i) { return s.scale(g0 + i); };
    for (size_t t = 0; t < a.n; ++t) {
      const int8_t* xq = a.q.data() + t * s.cols;
      float acc = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        const size_t ab = t * nb + b;
        const float sx = a.scale[ab];
        if (s.layout == QuantLayout::i8) {
          int32_t lo = 0, hi = 0;  // the two halves: Q6_K scales per 16
          for (int j = 0; j < 16; ++j) {
            lo += static_cast<int8_t>(wq[b * 32 + j]) * xq[b * 32 + j];
            hi += static_cast<int8_t>(wq[b * 32 + 16 + j]) * xq[b * 32 + 16 + j];
          }
          if (s.group == 16)
            acc += sx * (scales(2 * b) * static_cast<float>(lo) +
                         scales(2 * b + 1) * static_cast<float>(hi));
          else
            acc += scales(b) * sx * static_cast<float>(lo + hi);
          if (s.mins_per_16())
            acc += s.min(g0 + 2 * b) * a.half_sum[2 * ab] +
                   s.min(g0 + 2 * b + 1) * a.half_sum[2 * ab + 1];
          else if (s.has_min)
            acc += s.min(g0 + b) * a.sum[ab];
        } else {  // u4, u5, c4
          const uint8_t* blk = wq + b * layout_block_bytes(s.layout);
          int32_t dot = 0;
          for (size_t j = 0; j < 32; ++j) dot += s.value(blk, j) * xq[b * 32 + j];
          acc += scales(b) * sx * static_cast<float>(dot);
          if (s.has_min) acc += s.min(g0 + b) * a.sum[ab];
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace ref

namespace {

// Runs rows_fn over every segment, the output rows split across the pool.
template <class Acts, class Fn>
void run_segments(const QuantMatrix& w, const Acts& acts, float* y, Fn rows_fn, ThreadPool& pool) {
  pool.parallel_chunks(w.rows, [&](size_t r0, size_t r1) {
    size_t base = 0;  // first row of the segment
    for (const QuantSegment& s : w.segments) {
      const size_t lo = std::max(r0, base), hi = std::min(r1, base + s.rows);
      if (lo < hi) rows_fn(s, acts, y + base, w.rows, lo - base, hi - base);
      base += s.rows;
    }
  });
}

void quant_matmul_fp32(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                       Isa isa) {
  // Prefill on AMX tiles: the per-group tile sums beat the fp32 row kernel
  // once the 16-token A tiles are full.
  if (isa == Isa::amx && n >= amx::kMinQuantTokens) return amx::quant_matmul_fp32(w, x, n, y, pool);
  thread_local std::vector<float> sums, halves;
  sums.resize(n * (w.cols / 32));
  block_sums(x, n, w.cols, sums.data());
  const bool per_16 = std::any_of(w.segments.begin(), w.segments.end(),
                                  [](const QuantSegment& s) { return s.mins_per_16(); });
  if (per_16) {
    halves.resize(n * (w.cols / 16));
    block_sums(x, n, w.cols, halves.data(), 16);
  }
  const Fp32Acts acts{.x = x,
                      .block_sum = sums.data(),
                      .n = n,
                      .cols = w.cols,
                      .half_sum = per_16 ? halves.data() : nullptr};
  const QuantRowsFp32Fn rows_fn = isa >= Isa::avx512 ? avx512::quant_rows_fp32
                                  : isa >= Isa::avx2 ? avx2::quant_rows_fp32
                                                     : ref::quant_rows_fp32;
  run_segments(w, acts, y, rows_fn, pool);
}

void quant_matmul_int8(const QuantMatrix& w, const float* x, size_t n, float* y, ThreadPool& pool,
                       Isa isa) {
  thread_local QuantizedActs scratch;
  QuantizedActs& acts = scratch;  // the workers must use the caller's, not their own
  resize_acts(n, w.cols, acts);
  if (n == 1)  // decode: a few hundred values, not worth a pool dispatch
    quantize_blocks(x, acts, 0, w.cols / 32);
  else
    pool.parallel_chunks(n * (w.cols / 32),
                         [&](size_t i0, size_t i1) { quantize_blocks(x, acts, i0, i1); });
  const QuantRowsFn rows_fn = isa < Isa::avx2  ? ref::quant_rows
                              : has_avx_vnni() ? avxvnni::quant_rows
                                               : avx2::quant_rows;
  run_segments(w, acts, y, rows_fn, pool);
}

}  // namespace

void quant_matmul(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                  ThreadPool& pool) {
  quant_matmul(w, x, n, y, bias, pool, active_isa(), quant_precision());
}

void quant_matmul(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                  ThreadPool& pool, Isa isa, QuantPrecision p) {
  if (n == 0 || w.rows == 0) return;
  if (p == QuantPrecision::int8)
    quant_matmul_int8(w, x, n, y, pool, isa);
  else
    quant_matmul_fp32(w, x, n, y, pool, isa);
  if (bias)
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += bias[r];
}

void quant_matmul_rows(const QuantMatrix& w, const float* x, size_t n, float* y, const float* bias,
                       ThreadPool& pool, Isa isa, QuantPrecision p) {
  if (n == 0 || w.rows == 0) return;
  const size_t nb = w.cols / 32;
  if (p == QuantPrecision::int8) {
    // The row kernel's multi-token tiles (1 row x 4 tokens: a block of weights
    // unpacked once for four tokens) do each token's arithmetic in the GEMV's
    // order, and blocks quantize alone, so this is the per-token GEMV, bit for bit.
    thread_local QuantizedActs scratch;
    QuantizedActs& acts = scratch;  // the workers must use the caller's
    resize_acts(n, w.cols, acts);
    quantize_blocks(x, acts, 0, n * nb);
    const QuantRowsFn rows_fn = isa < Isa::avx2  ? ref::quant_rows
                                : has_avx_vnni() ? avxvnni::quant_rows
                                                 : avx2::quant_rows;
    run_segments(w, acts, y, rows_fn, pool);
  } else {
    thread_local std::vector<float> sums, halves;
    sums.resize(n * nb);
    block_sums(x, n, w.cols, sums.data());
    const bool per_16 = std::any_of(w.segments.begin(), w.segments.end(),
                                    [](const QuantSegment& s) { return s.mins_per_16(); });
    if (per_16) {
      halves.resize(n * 2 * nb);
      block_sums(x, n, w.cols, halves.data(), 16);
    }
    const Fp32Acts acts{.x = x,
                        .block_sum = sums.data(),
                        .n = n,
                        .cols = w.cols,
                        .half_sum = per_16 ? halves.data() : nullptr,
                        .per_token = true};
    const QuantRowsFp32Fn rows_fn = isa >= Isa::avx512 ? avx512::quant_rows_fp32
                                    : isa >= Isa::avx2 ? avx2::quant_rows_fp32
                                                       : ref::quant_rows_fp32;
    run_segments(w, acts, y, rows_fn, pool);
  }
  if (bias)
    for (size_t t = 0; t < n; ++t)
      for (size_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += bias[r];
}

}  // namespace edgellm::kernels
