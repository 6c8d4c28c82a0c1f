// The c4 layout (IQ4_NL, IQ4_XS, MXFP4: 4-bit codes into a per-segment int8
// codebook, kernels/quant.h): what it streams, and the power of the kernel
// checks on it. quant_test.cpp runs these formats through every kernel on odd
// shapes against the scalar references; here each fast kernel is shown to fail
// those checks when it multiplies the codes without their codebook
// (Fault::c4_codes_as_values), and to pass them otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "edgellm/bf16.h"
#include "edgellm/thread_pool.h"
#include "kernels/fault_injection.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace edgellm::kernels {
namespace {

// GGUF blocks of a c4 format with random codes and sane scales: MXFP4 E8M0
// exponents 118..130 (exact halves), IQ4 f16 scales +-[2^-9, 2^0).
std::vector<uint8_t> c4_blocks(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  const size_t n = rows * cols / block_elems(f), bb = block_bytes(f);
  std::vector<uint8_t> b(n * bb);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < n; ++i) {
    uint8_t* blk = b.data() + i * bb;
    if (f == BlockFormat::mxfp4) {
      blk[0] = static_cast<uint8_t>(118 + rng() % 13);
    } else {  // IQ4_NL's d, IQ4_XS's d (its 6-bit sub-scales are any bits)
      const uint16_t h =
          static_cast<uint16_t>((rng() & 1) << 15 | (6 + rng() % 9) << 10 | (rng() % 1024));
      blk[0] = static_cast<uint8_t>(h & 0xff);
      blk[1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return b;
}

QuantMatrix c4_matrix(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  const auto blocks = c4_blocks(f, rows, cols, rng);
  QuantMatrix m;
  append_segment(m, repack_gguf(f, blocks.data(), rows, cols));
  return m;
}

// MXFP4 streams its GGUF's own 17 bytes per 32 weights (the codes and the
// E8M0 byte), IQ4_NL its codes and a half scale (18, as its file), IQ4_XS its
// codes and an fp32 scale (d * (ls - 32) is rarely a half): no int8 copy of 32.
TEST(C4Test, CodebookFormatsStreamFourBitsAWeight) {
  std::mt19937 rng(41);
  const size_t rows = 3, cols = 256, blocks = rows * cols / 32;
  for (BlockFormat f : {BlockFormat::iq4_nl, BlockFormat::iq4_xs, BlockFormat::mxfp4}) {
    const QuantMatrix w = c4_matrix(f, rows, cols, rng);
    const QuantSegment& s = w.segments[0];
    EXPECT_EQ(s.layout, QuantLayout::c4) << block_format_name(f);
    EXPECT_EQ(s.row_bytes(), cols / 2) << block_format_name(f);
    const size_t scale_bytes = f == BlockFormat::mxfp4 ? 1 : f == BlockFormat::iq4_nl ? 2 : 4;
    EXPECT_EQ(w.bytes(), blocks * (16 + scale_bytes)) << block_format_name(f);
  }
  EXPECT_EQ(c4_matrix(BlockFormat::mxfp4, rows, cols, rng).bytes(),
            blocks * block_bytes(BlockFormat::mxfp4));
}

// Per output: sum_c |w x| (the scale of fp32 rounding), over the dequantized weights.
std::vector<double> magnitudes(const QuantMatrix& w, const std::vector<float>& x, size_t n) {
  std::vector<double> mag(n * w.rows, 0.0);
  std::vector<float> row(w.cols);
  for (size_t r = 0; r < w.rows; ++r) {
    dequant_row(w, r, row.data());
    for (size_t t = 0; t < n; ++t)
      for (size_t c = 0; c < w.cols; ++c)
        mag[t * w.rows + r] += std::fabs(double(row[c]) * x[t * w.cols + c]);
  }
  return mag;
}

// The scalar fp32 reference for x (all tokens).
std::vector<float> reference(const QuantMatrix& w, const std::vector<float>& x, size_t n) {
  std::vector<float> sums(n * w.cols / 32), y(n * w.rows);
  block_sums(x.data(), n, w.cols, sums.data());
  const Fp32Acts a{.x = x.data(), .block_sum = sums.data(), .n = n, .cols = w.cols};
  ref::quant_rows_fp32(w.segments[0], a, y.data(), w.rows, 0, w.rows);
  return y;
}

// A kernel under test: its outputs for (w, x, n), and the reference they must
// match (the fp32 reference on x, or on x rounded to bf16 for the bf16 kernels;
// the integer reference for the int8 kernels).
struct Case {
  std::string name;
  std::function<std::vector<float>(const QuantMatrix&, const std::vector<float>&, size_t)> run,
      want;
  size_t n;
};

// The largest |got - want| in units of the fp32 tolerance (2 cols eps sum|w x|)
// for the fp32 and bf16 kernels; for the int8 ones, of the integer path's own
// (activation rounding is in both).
double worst(const Case& c, const QuantMatrix& w, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(c.n * w.cols);
  for (auto& v : x) v = d(rng);
  const auto got = c.run(w, x, c.n), want = c.want(w, x, c.n);
  const auto mag = magnitudes(w, x, c.n);
  double ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    ratio = std::max(ratio, std::fabs(double(got[i]) - want[i]) /
                                (2.0 * double(w.cols) * 6e-8 * mag[i] + 1e-30));
  return ratio;
}

using WholeFn = void (*)(const QuantMatrix&, const float*, size_t, float*, ThreadPool&);

std::vector<Case> fast_kernels(ThreadPool& pool) {
  auto rows_fp32 = [](QuantRowsFp32Fn fn) {
    return [fn](const QuantMatrix& w, const std::vector<float>& x, size_t n) {
      std::vector<float> sums(n * w.cols / 32), y(n * w.rows);
      block_sums(x.data(), n, w.cols, sums.data());
      const Fp32Acts a{.x = x.data(), .block_sum = sums.data(), .n = n, .cols = w.cols};
      fn(w.segments[0], a, y.data(), w.rows, 0, w.rows);
      return y;
    };
  };
  auto rows_int8 = [](QuantRowsFn fn) {
    return [fn](const QuantMatrix& w, const std::vector<float>& x, size_t n) {
      QuantizedActs a;
      quantize_acts(x.data(), n, w.cols, a);
      std::vector<float> y(n * w.rows);
      fn(w.segments[0], a, y.data(), w.rows, 0, w.rows);
      return y;
    };
  };
  auto whole = [&pool](WholeFn fn) {
    return [fn, &pool](const QuantMatrix& w, const std::vector<float>& x, size_t n) {
      std::vector<float> y(n * w.rows);
      fn(w, x.data(), n, y.data(), pool);
      return y;
    };
  };
  const auto on_bf16_x = [](const QuantMatrix& w, const std::vector<float>& x, size_t n) {
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = round_to_bf16(x[i]);
    return reference(w, xr, n);
  };
  std::vector<Case> cases;
  // 1 token: the decode tiles; 5 and 19: batched and prefill tiles with remainders.
  for (size_t n : {1, 5, 19}) {
    if (detect_isa() >= Isa::avx2) {
      cases.push_back({"avx2 fp32", rows_fp32(avx2::quant_rows_fp32), reference, n});
      cases.push_back({"avx2 int8", rows_int8(avx2::quant_rows), rows_int8(ref::quant_rows), n});
    }
    if (has_avx_vnni())
      cases.push_back(
          {"avxvnni int8", rows_int8(avxvnni::quant_rows), rows_int8(ref::quant_rows), n});
    if (detect_isa() >= Isa::avx512) {
      cases.push_back({"avx512 fp32", rows_fp32(avx512::quant_rows_fp32), reference, n});
      cases.push_back({"avx512 bf16 gemv", whole(avx512::quant_gemv_bf16), on_bf16_x, n});
      cases.push_back({"avx512 bf16 prefill", whole(avx512::quant_matmul_bf16), on_bf16_x, n});
    }
  }
  if (runnable_isa() == Isa::amx) {  // its A tiles take 16 tokens and more
    cases.push_back({"amx fp32 prefill", whole(amx::quant_matmul_fp32), reference, 19});
    cases.push_back({"amx bf16 prefill", whole(amx::quant_matmul_bf16), on_bf16_x, 19});
  }
  return cases;
}

// MXFP4's E8M0 bytes 0 and 1 are subnormal scales (2^-128, 2^-127): every
// kernel's conversion must keep them. A matrix of only tiny scales (bytes
// 0..3), held to the reference relative to sum |w x| (the fp32 tolerance's
// absolute floor would hide them).
TEST(C4Test, SubnormalScalesReachEveryKernel) {
  ThreadPool pool(2);
  std::mt19937 rng(47);
  const auto cases = fast_kernels(pool);
  if (cases.empty()) GTEST_SKIP() << "no SIMD tier on this CPU: only the scalar path runs";
  // 11 blocks a row: the scales' 8-wide conversion and its scalar tail.
  auto blocks = c4_blocks(BlockFormat::mxfp4, 21, 352, rng);
  for (size_t i = 0; i < blocks.size(); i += 17) blocks[i] = static_cast<uint8_t>(rng() % 4);
  QuantMatrix w;
  append_segment(w, repack_gguf(BlockFormat::mxfp4, blocks.data(), 21, 352));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " n " + std::to_string(c.n));
    std::vector<float> x(c.n * w.cols);
    for (auto& v : x) v = d(rng);
    const auto got = c.run(w, x, c.n), want = c.want(w, x, c.n);
    const auto mag = magnitudes(w, x, c.n);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_GT(mag[i], 0.0);
      ASSERT_NEAR(got[i], want[i], 1e-3 * mag[i]) << "at " << i << ", sum |w x| " << mag[i];
    }
  }
}

TEST(C4Test, CodesWithoutTheirCodebookAreCaught) {
  ThreadPool pool(2);
  std::mt19937 rng(43);
  const auto cases = fast_kernels(pool);
  if (cases.empty()) GTEST_SKIP() << "no SIMD tier on this CPU: only the scalar path runs";
  for (BlockFormat f : {BlockFormat::iq4_nl, BlockFormat::iq4_xs, BlockFormat::mxfp4}) {
    // Rows off every row tile (4, 2, 16), an odd block count (the bf16 GEMV's pairs).
    const size_t cols = f == BlockFormat::iq4_xs ? 768 : 96;
    const QuantMatrix w = c4_matrix(f, 21, cols, rng);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(block_format_name(f)) + " " + c.name + " n " + std::to_string(c.n));
      EXPECT_LE(worst(c, w, rng), 1.0) << "outside the tolerance";
      fault::Scoped no_codebook(fault::Fault::c4_codes_as_values);
      EXPECT_GT(worst(c, w, rng), 1.0) << "codes without their codebook went unnoticed";
    }
  }
}

}  // namespace
}  // namespace edgellm::kernels
