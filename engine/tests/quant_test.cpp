// Quantized kernels, both activation precisions: every ISA path against the
// scalar reference of its precision; the fp32 reference against a double dot
// product on the exactly dequantized weights; the integer path within
// activation rounding of it. Every block format (kFormats), odd shapes (rows not a
// multiple of the 4- or 2-row tile, token counts not a multiple of the 4-token
// tile, 8 for the fp32 prefill tile).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "edgellm/bf16.h"
#include "edgellm/thread_pool.h"
#include "kernels/fault_injection.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "sanitized.h"

namespace edgellm::kernels {
namespace {

constexpr BlockFormat kFormats[] = {BlockFormat::q4_0, BlockFormat::q4_1,   BlockFormat::q5_0,
                                    BlockFormat::q5_1, BlockFormat::q8_0,   BlockFormat::q2_k,
                                    BlockFormat::q3_k, BlockFormat::q4_k,   BlockFormat::q5_k,
                                    BlockFormat::q6_k, BlockFormat::iq4_nl, BlockFormat::iq4_xs,
                                    BlockFormat::mxfp4};

// A random f16 in +-[2^-9, 2^0): a sane block scale.
void put_f16(uint8_t* p, std::mt19937& rng, bool allow_negative) {
  const uint16_t exp = 6 + rng() % 9, mant = rng() % 1024;
  const uint16_t sign = allow_negative && (rng() & 1) ? 0x8000 : 0;
  const uint16_t h = sign | static_cast<uint16_t>(exp << 10) | mant;
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random GGUF blocks with valid scales, for `rows` rows of `cols` elements.
std::vector<uint8_t> random_blocks(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  const size_t n = rows * cols / block_elems(f), bb = block_bytes(f);
  std::vector<uint8_t> b(n * bb);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < n; ++i) {
    uint8_t* blk = b.data() + i * bb;
    switch (f) {
      case BlockFormat::q4_1:
      case BlockFormat::q5_1:
        put_f16(blk + 2, rng, true);  // the min
        [[fallthrough]];
      case BlockFormat::q4_0:
      case BlockFormat::q5_0:
      case BlockFormat::q8_0:
      case BlockFormat::iq4_nl:
      case BlockFormat::iq4_xs:
        put_f16(blk, rng, true);
        break;
      case BlockFormat::q4_k:
      case BlockFormat::q5_k:
        put_f16(blk, rng, false);
        put_f16(blk + 2, rng, false);
        break;
      case BlockFormat::q2_k:
        put_f16(blk + 80, rng, false);
        put_f16(blk + 82, rng, false);
        break;
      case BlockFormat::q3_k:
        put_f16(blk + 108, rng, true);
        break;
      case BlockFormat::q6_k:
        put_f16(blk + 208, rng, true);
        break;
      case BlockFormat::mxfp4:  // E8M0 118..130: half-scales 2^-10 .. 2^2
        blk[0] = static_cast<uint8_t>(118 + rng() % 13);
        break;
    }
  }
  return b;
}

QuantMatrix random_matrix(BlockFormat f, size_t rows, size_t cols, std::mt19937& rng) {
  QuantMatrix m;
  const auto blocks = random_blocks(f, rows, cols, rng);
  append_segment(m, repack_gguf(f, blocks.data(), rows, cols));
  return m;
}

// fp32 activations with the sums the kernels take: per 32, and per 16 (for
// Q2_K's mins), both kept in `sums`.
Fp32Acts fp32_acts(const std::vector<float>& x, size_t n, size_t cols, std::vector<float>& sums) {
  sums.resize(n * cols / 32 + n * cols / 16);
  float* half = sums.data() + n * cols / 32;
  block_sums(x.data(), n, cols, sums.data());
  block_sums(x.data(), n, cols, half, 16);
  return {.x = x.data(), .block_sum = sums.data(), .n = n, .cols = cols, .half_sum = half};
}

std::vector<float> random_x(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

std::vector<Isa> test_isas() {
  std::vector<Isa> isas{Isa::scalar};
  if (detect_isa() == Isa::avx2) isas.push_back(Isa::avx2);
  return isas;
}

struct IsaScope {
  explicit IsaScope(Isa isa) : saved(active_isa()) { set_isa(isa); }
  ~IsaScope() { set_isa(saved); }
  Isa saved;
};

struct PrecisionScope {
  explicit PrecisionScope(QuantPrecision p) : saved(quant_precision()) { set_quant_precision(p); }
  ~PrecisionScope() { set_quant_precision(saved); }
  QuantPrecision saved;
};

// Every tier the CPU has, for the fp32 path (dispatch: avx512 > avx2 > scalar).
std::vector<Isa> fp32_isas() {
  std::vector<Isa> isas{Isa::scalar};
  if (detect_isa() >= Isa::avx2) isas.push_back(Isa::avx2);
  if (detect_isa() >= Isa::avx512) isas.push_back(Isa::avx512);
  return isas;
}

// sum_c |w[r][c] * x[t][c]| per output: the scale of fp32 rounding error.
std::vector<double> abs_products(const QuantMatrix& w, const std::vector<float>& x, size_t n) {
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

// The fp32 tolerance: a different summation order over `cols` terms.
double fp32_tol(double mag, size_t cols) {
  return 2.0 * double(cols) * 6e-8 * mag + 1e-30;
}

TEST(QuantTest, Fp32EveryTierMatchesTheReference) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  PrecisionScope precision(QuantPrecision::fp32);
  for (BlockFormat f : kFormats) {
    const size_t unit = block_elems(f);
    for (size_t rows : {1, 3, 5, 17}) {
      // 67 blocks of 32 and 9 of 256 cross the kernels' 64-block scale chunks.
      for (size_t cols : {unit, 3 * unit, 9 * unit, unit == 32 ? 67 * unit : 11 * unit}) {
        const QuantMatrix w = random_matrix(f, rows, cols, rng);
        // Full prefill tiles of 8 tokens and every 4 / 2 / 1 remainder.
        for (size_t n : {1, 2, 3, 5, 7, 12, 19}) {
          SCOPED_TRACE(std::string(block_format_name(f)) + " rows " + std::to_string(rows) +
                       " cols " + std::to_string(cols) + " n " + std::to_string(n));
          const auto x = random_x(n * cols, rng);
          std::vector<float> sums;
          const Fp32Acts acts = fp32_acts(x, n, cols, sums);
          std::vector<float> want(n * rows, NAN);
          ref::quant_rows_fp32(w.segments[0], acts, want.data(), rows, 0, rows);
          const auto mag = abs_products(w, x, n);
          // Each SIMD kernel directly, on a row range that starts inside the matrix.
          std::vector<std::pair<const char*, QuantRowsFp32Fn>> kernels;
          if (detect_isa() >= Isa::avx2) kernels.push_back({"avx2", avx2::quant_rows_fp32});
          if (detect_isa() >= Isa::avx512) kernels.push_back({"avx512", avx512::quant_rows_fp32});
          for (const auto& [name, fn] : kernels) {
            std::vector<float> got(n * rows, NAN);
            const size_t r0 = rows > 1 ? 1 : 0;
            if (r0) ref::quant_rows_fp32(w.segments[0], acts, got.data(), rows, 0, r0);
            fn(w.segments[0], acts, got.data(), rows, r0, rows);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], fp32_tol(mag[i], cols)) << name << " at " << i;
          }
          for (Isa isa : fp32_isas()) {
            IsaScope scope(isa);
            std::vector<float> got(n * rows, NAN);
            quant_matmul(w, x.data(), n, got.data(), nullptr, pool);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], fp32_tol(mag[i], cols)) << isa_name(isa) << " at " << i;
          }
        }
      }
    }
  }
}

// The fp32 reference is the dequantized weights times x: against a double dot
// product on dequant_row (bit-identical to gguf-py), only fp32 rounding differs.
TEST(QuantTest, Fp32ReferenceIsTheDequantizedProduct) {
  std::mt19937 rng(12);
  for (BlockFormat f : kFormats) {
    const size_t rows = 6, cols = 3 * block_elems(f), n = 3;
    const QuantMatrix w = random_matrix(f, rows, cols, rng);
    const auto x = random_x(n * cols, rng);
    std::vector<float> sums, y(n * rows), row(cols);
    const Fp32Acts acts = fp32_acts(x, n, cols, sums);
    ref::quant_rows_fp32(w.segments[0], acts, y.data(), rows, 0, rows);
    const auto mag = abs_products(w, x, n);
    for (size_t r = 0; r < rows; ++r) {
      dequant_row(w, r, row.data());
      for (size_t t = 0; t < n; ++t) {
        double exact = 0.0;
        for (size_t c = 0; c < cols; ++c) exact += double(row[c]) * x[t * cols + c];
        EXPECT_NEAR(y[t * rows + r], exact, fp32_tol(mag[t * rows + r], cols))
            << block_format_name(f) << " row " << r << " token " << t;
      }
    }
  }
}

// fp32 is the default; int8 is a different computation the switch really selects.
TEST(QuantTest, PrecisionSwitchSelectsThePath) {
  EXPECT_EQ(quant_precision_name(QuantPrecision::fp32), "fp32");
  EXPECT_EQ(quant_precision_name(QuantPrecision::int8), "int8");
  if (std::getenv("EDGELLM_QUANT_PRECISION") == nullptr) {
    EXPECT_EQ(quant_precision(), QuantPrecision::fp32);
  }
  std::mt19937 rng(13);
  ThreadPool pool(1);
  const QuantMatrix w = random_matrix(BlockFormat::q4_1, 5, 64, rng);
  const auto x = random_x(64, rng);
  std::vector<float> y32(5), y8(5), want(5);
  {
    PrecisionScope p(QuantPrecision::fp32);
    quant_matmul(w, x.data(), 1, y32.data(), nullptr, pool);
  }
  {
    PrecisionScope p(QuantPrecision::int8);
    quant_matmul(w, x.data(), 1, y8.data(), nullptr, pool);
  }
  QuantizedActs acts;
  quantize_acts(x.data(), 1, 64, acts);
  ref::quant_rows(w.segments[0], acts, want.data(), 5, 0, 5);
  EXPECT_NE(y32, y8);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(y8[i], want[i], 1e-4f * (1.0f + std::fabs(want[i])));
}

TEST(QuantTest, EveryIsaMatchesTheIntegerReference) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  PrecisionScope precision(QuantPrecision::int8);
  for (BlockFormat f : kFormats) {
    const size_t unit = block_elems(f);
    for (size_t rows : {1, 3, 5, 17}) {
      for (size_t cols : {unit, 3 * unit, 9 * unit}) {
        const QuantMatrix w = random_matrix(f, rows, cols, rng);
        for (size_t n : {1, 2, 5}) {
          SCOPED_TRACE(std::string(block_format_name(f)) + " rows " + std::to_string(rows) +
                       " cols " + std::to_string(cols) + " n " + std::to_string(n));
          const auto x = random_x(n * cols, rng);
          QuantizedActs acts;
          quantize_acts(x.data(), n, cols, acts);
          std::vector<float> want(n * rows);
          ref::quant_rows(w.segments[0], acts, want.data(), rows, 0, rows);
          // Scale of the terms: the tolerance for a different summation order.
          std::vector<float> row(cols);
          double mag = 0.0;
          for (size_t r = 0; r < rows; ++r) {
            dequant_row(w, r, row.data());
            for (size_t c = 0; c < cols; ++c) mag = std::max(mag, std::fabs(double(row[c])));
          }
          // Each SIMD row kernel directly (the dispatch picks only one of them).
          std::vector<std::pair<const char*, QuantRowsFn>> kernels;
          if (detect_isa() >= Isa::avx2) kernels.push_back({"avx2", avx2::quant_rows});
          if (has_avx_vnni()) kernels.push_back({"avxvnni", avxvnni::quant_rows});
          for (const auto& [name, fn] : kernels) {
            std::vector<float> got(n * rows, NAN);
            fn(w.segments[0], acts, got.data(), rows, 0, rows);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], 1e-5 * mag * 4.0 * cols + 1e-6) << name << " at " << i;
          }
          for (Isa isa : test_isas()) {
            IsaScope scope(isa);
            std::vector<float> got(n * rows, NAN);
            quant_matmul(w, x.data(), n, got.data(), nullptr, pool);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], 1e-5 * mag * 4.0 * cols + 1e-6)
                  << isa_name(isa) << " at " << i;
          }
        }
      }
    }
  }
}

// |sum w (x - x_hat)| <= sum |w| * scale_b / 2: activation rounding is the only error.
TEST(QuantTest, IntegerPathIsWithinActivationRoundingOfFp32) {
  std::mt19937 rng(2);
  ThreadPool pool(1);
  PrecisionScope precision(QuantPrecision::int8);
  for (BlockFormat f : kFormats) {
    const size_t rows = 7, cols = 2 * block_elems(f), n = 3;
    const QuantMatrix w = random_matrix(f, rows, cols, rng);
    const auto x = random_x(n * cols, rng);
    std::vector<float> y(n * rows);
    quant_matmul(w, x.data(), n, y.data(), nullptr, pool);
    std::vector<float> row(cols);
    for (size_t r = 0; r < rows; ++r) {
      dequant_row(w, r, row.data());
      for (size_t t = 0; t < n; ++t) {
        double exact = 0.0, bound = 1e-4;
        for (size_t b = 0; b < cols / 32; ++b) {
          float amax = 0.0f;
          for (size_t j = 0; j < 32; ++j)
            amax = std::max(amax, std::fabs(x[t * cols + b * 32 + j]));
          for (size_t j = 0; j < 32; ++j) {
            const size_t c = b * 32 + j;
            exact += double(row[c]) * x[t * cols + c];
            bound += std::fabs(row[c]) * (amax / 127.0) * 0.5 * 1.01;
          }
        }
        EXPECT_NEAR(y[t * rows + r], exact, bound) << block_format_name(f) << " row " << r;
      }
    }
  }
}

TEST(QuantTest, MixedSegmentsAndBiasThroughMatmul) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const size_t cols = 256;
  auto q = std::make_shared<QuantMatrix>();
  for (BlockFormat f : {BlockFormat::q5_0, BlockFormat::q4_k, BlockFormat::q8_0}) {
    const auto blocks = random_blocks(f, 3, cols, rng);
    append_segment(*q, repack_gguf(f, blocks.data(), 3, cols));
  }
  ASSERT_EQ(q->rows, 9u);
  std::vector<float> bias(9);
  for (size_t i = 0; i < 9; ++i) bias[i] = 0.5f * float(i);
  PackedMatrix m = pack_quant(q, active_isa());
  m.bias = bias.data();
  const auto x = random_x(2 * cols, rng);
  std::vector<float> y(18), y_nobias(18);
  matmul(m, x.data(), 2, y.data(), pool);
  quant_matmul(*q, x.data(), 2, y_nobias.data(), nullptr, pool);
  for (size_t i = 0; i < 18; ++i) EXPECT_FLOAT_EQ(y[i], y_nobias[i] + bias[i % 9]);
  // unpack_row reads the right segment: row 4 is the Q4_K segment's row 1.
  std::vector<float> a(cols), b(cols);
  unpack_row(m, 4, a.data());
  QuantMatrix only;
  only.rows = 3;
  only.cols = cols;
  only.segments = {q->segments[1]};
  dequant_row(only, 1, b.data());
  EXPECT_EQ(a, b);
}

// Batched decode (matmul_rows' quantized path): each token's outputs are its
// own n == 1 GEMV's, bit for bit, on every format, tier and precision; odd row
// counts (the 4-row tile's remainders, pool chunks of 3 threads), one to nine
// tokens, and a matrix of three segments of different formats.
TEST(QuantTest, RowsBitIdenticalToGemvPerToken) {
  std::mt19937 rng(11);
  ThreadPool pool(3);
  std::vector<std::pair<std::string, QuantMatrix>> matrices;
  for (BlockFormat f : kFormats)
    for (size_t rows : {1, 5, 70})
      for (size_t cols : {block_elems(f), 3 * block_elems(f)})
        matrices.emplace_back(std::string(block_format_name(f)) + " " + std::to_string(rows) + "x" +
                                  std::to_string(cols),
                              random_matrix(f, rows, cols, rng));
  QuantMatrix mixed;  // i8 per 16, u4, u5, i8 per 16
  for (BlockFormat f :
       {BlockFormat::q2_k, BlockFormat::q4_0, BlockFormat::q5_0, BlockFormat::q6_k}) {
    const size_t rows = mixed.segments.size() + 5;
    const auto blocks = random_blocks(f, rows, 256, rng);
    append_segment(mixed, repack_gguf(f, blocks.data(), rows, 256));
  }
  matrices.emplace_back("mixed 26x256", std::move(mixed));
  for (const auto& [name, w] : matrices)
    for (size_t n = 1; n <= 9; ++n) {
      const auto x = random_x(n * w.cols, rng);
      std::vector<float> bias(w.rows);
      for (size_t r = 0; r < w.rows; ++r) bias[r] = 0.25f * float(r);
      for (Isa isa : fp32_isas())
        for (QuantPrecision p : {QuantPrecision::fp32, QuantPrecision::int8}) {
          SCOPED_TRACE(name + " n " + std::to_string(n) + " " + std::string(isa_name(isa)) +
                       (p == QuantPrecision::int8 ? " int8" : " fp32"));
          std::vector<float> batched(n * w.rows + 1, -7.0f), alone(w.rows);
          quant_matmul_rows(w, x.data(), n, batched.data(), bias.data(), pool, isa, p);
          EXPECT_EQ(batched.back(), -7.0f) << "wrote past the output";
          for (size_t t = 0; t < n; ++t) {
            quant_matmul(w, x.data() + t * w.cols, 1, alone.data(), bias.data(), pool, isa, p);
            EXPECT_EQ(
                0, std::memcmp(alone.data(), batched.data() + t * w.rows, w.rows * sizeof(float)))
                << "token " << t;
          }
        }
    }
}

// Scales that are exact halves are stored as halves (Q4_1's are by construction);
// Q4_K's products d * sc generally are not. The tests above run both kinds.
TEST(QuantTest, ExactHalfScalesAreStoredAsHalves) {
  std::mt19937 rng(6);
  EXPECT_TRUE(random_matrix(BlockFormat::q4_1, 3, 64, rng).segments[0].half_scales);
  EXPECT_TRUE(random_matrix(BlockFormat::q8_0, 3, 64, rng).segments[0].half_scales);
  EXPECT_FALSE(random_matrix(BlockFormat::q4_k, 3, 256, rng).segments[0].half_scales);
}

// The memory a repacked matrix holds is what it streams, plus nothing: the fp32
// scales a half-scale format was first read into are freed, not just cleared
// (they were a fifth of a Q4_0 model's resident memory), and repacked_bytes(),
// the memory check's figure, is what the segment allocates.
TEST(QuantTest, RepackedMatrixHoldsOnlyItsBytes) {
  std::mt19937 rng(8);
  for (BlockFormat f : {BlockFormat::q4_0, BlockFormat::q4_1, BlockFormat::q5_0, BlockFormat::q8_0,
                        BlockFormat::q4_k, BlockFormat::q6_k}) {
    const size_t rows = 5, cols = 512;
    const QuantSegment s = repack_gguf(f, random_blocks(f, rows, cols, rng).data(), rows, cols);
    const size_t held = s.qs.capacity() + (s.scales.capacity() + s.mins.capacity()) * 4 +
                        (s.scales16.capacity() + s.mins16.capacity()) * 2;
    EXPECT_EQ(held, s.bytes()) << block_format_name(f);
    EXPECT_LE(s.bytes(), repacked_bytes(f, rows, cols)) << block_format_name(f);
    if (s.half_scales) EXPECT_EQ(s.bytes(), repacked_bytes(f, rows, cols)) << block_format_name(f);
  }
}

// Q5_0 and Q5_1 repack into u5 and stream exactly their GGUF bytes: 16 bytes
// of nibbles + 4 of fifth bits + the half scale (and min) per block of 32.
TEST(QuantTest, Q5FormatsStreamTheirGgufSize) {
  std::mt19937 rng(7);
  for (BlockFormat f : {BlockFormat::q5_0, BlockFormat::q5_1}) {
    const QuantMatrix w = random_matrix(f, 3, 96, rng);
    const QuantSegment& s = w.segments[0];
    EXPECT_EQ(s.layout, QuantLayout::u5) << block_format_name(f);
    EXPECT_TRUE(s.half_scales) << block_format_name(f);
    EXPECT_EQ(s.row_bytes(), 3u * 20u);
    EXPECT_EQ(w.bytes(), 3u * 3u * block_bytes(f)) << block_format_name(f);
  }
}

TEST(QuantTest, RowOrderPermutesRows) {
  std::mt19937 rng(4);
  const auto blocks = random_blocks(BlockFormat::q4_1, 4, 64, rng);
  const int32_t order[] = {2, 0, 3, 1};
  QuantMatrix plain, permuted;
  append_segment(plain, repack_gguf(BlockFormat::q4_1, blocks.data(), 4, 64));
  append_segment(permuted, repack_gguf(BlockFormat::q4_1, blocks.data(), 4, 64, order));
  std::vector<float> a(64), b(64);
  for (size_t r = 0; r < 4; ++r) {
    dequant_row(permuted, r, a.data());
    dequant_row(plain, static_cast<size_t>(order[r]), b.data());
    EXPECT_EQ(a, b);
  }
}

// Known blocks decoded by hand from ggml's definitions.
TEST(QuantTest, DecodesHandBuiltBlocks) {
  // Q4_1: d = 0.5, m = -1, byte j = (j & 15) | (15 - (j & 15)) << 4.
  std::vector<uint8_t> q41(20);
  q41[1] = 0x38;  // f16 0.5
  q41[3] = 0xbc;  // f16 -1.0
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  QuantMatrix m;
  append_segment(m, repack_gguf(BlockFormat::q4_1, q41.data(), 1, 32));
  std::vector<float> out(32);
  dequant_row(m, 0, out.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }
  // Q5_0: d = 1, qh bit j set for odd j, low nibbles 0: q = 16 * (j odd) - 16.
  std::vector<uint8_t> q50(22, 0);
  q50[1] = 0x3c;
  q50[2] = q50[3] = q50[4] = q50[5] = 0xaa;
  QuantMatrix m5;
  append_segment(m5, repack_gguf(BlockFormat::q5_0, q50.data(), 1, 32));
  dequant_row(m5, 0, out.data());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], j % 2 ? 0.0f : -16.0f) << j;
  // Q5_1: d = 0.5, m = -1, nibble j % 16 + 1 - 2 (j / 16) (both nibble halves),
  // fifth bit set for j in {3, 9, 20, 31} (one in each qh byte): q = nibble + 16 * bit.
  std::vector<uint8_t> q51(24, 0);
  q51[1] = 0x38;
  q51[3] = 0xbc;
  const uint32_t qh = 1u << 3 | 1u << 9 | 1u << 20 | 1u << 31;
  std::memcpy(q51.data() + 4, &qh, 4);
  for (int j = 0; j < 16; ++j) q51[8 + j] = static_cast<uint8_t>((j + 1) % 16 | (15 - j) << 4);
  QuantMatrix m51;
  append_segment(m51, repack_gguf(BlockFormat::q5_1, q51.data(), 1, 32));
  dequant_row(m51, 0, out.data());
  for (int j = 0; j < 32; ++j) {
    const int nibble = j < 16 ? (j + 1) % 16 : 15 - (j - 16);
    const int q = nibble + 16 * static_cast<int>((qh >> j) & 1);
    EXPECT_EQ(out[j], 0.5f * static_cast<float>(q) - 1.0f) << j;
  }
}

TEST(QuantTest, QuantizeRowsRoundTrips) {
  std::mt19937 rng(5);
  const size_t rows = 3, cols = 96;
  const auto x = random_x(rows * cols, rng);
  for (BlockFormat f : {BlockFormat::q8_0, BlockFormat::q4_0}) {
    QuantMatrix m;
    append_segment(m, quantize_rows(f, x.data(), rows, cols));
    std::vector<float> row(cols);
    for (size_t r = 0; r < rows; ++r) {
      dequant_row(m, r, row.data());
      for (size_t b = 0; b < cols / 32; ++b) {
        float amax = 0.0f;
        for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[r * cols + b * 32 + j]));
        // q8_0 rounds to the nearest step; q4_0's grid is -8..7 steps of max/-8, so the
        // end opposite the largest magnitude can be a whole step off (ggml's clamp).
        const float tol = f == BlockFormat::q8_0 ? amax / 127.0f * 0.51f : amax / 8.0f * 1.01f;
        for (size_t j = 0; j < 32; ++j) {
          const size_t c = b * 32 + j;
          EXPECT_NEAR(row[c], x[r * cols + c], tol + 1e-3f * amax)
              << block_format_name(f) << " " << r << "," << c;
        }
      }
    }
  }
  EXPECT_ANY_THROW(quantize_rows(BlockFormat::q8_0, x.data(), 1, 33));
}

// Fast-path mutant: a tile config kept from the previous shape (Q8_0's K = 32
// groups, then Q6_K's K = 16) must fail the same reference check.
TEST(QuantTest, AmxStaleTileConfigIsCaught) {
  if (runnable_isa() != Isa::amx) GTEST_SKIP() << "amx tier not on this CPU: mutant not run";
  // The stale config loads whole tiles past a tail's buffer, as the silicon would: ASan
  // stops the mutant at that read. `make test` runs it.
  if (testing::kSanitized)
    GTEST_SKIP() << "under ASan the stale-config mutant reads past its buffer by design";
  std::mt19937 rng(29);
  ThreadPool pool(2);
  const size_t n = 33;
  for (BlockFormat f : {BlockFormat::q6_k, BlockFormat::q8_0}) {
    const QuantMatrix w = random_matrix(f, 45, 2 * block_elems(f), rng);
    const auto x = random_x(n * w.cols, rng);
    std::vector<float> sums;
    const Fp32Acts acts = fp32_acts(x, n, w.cols, sums);
    std::vector<float> want(n * w.rows);
    ref::quant_rows_fp32(w.segments[0], acts, want.data(), w.rows, 0, w.rows);
    const auto mag = abs_products(w, x, n);
    std::vector<float> got(n * w.rows);
    {
      fault::Scoped stale(fault::Fault::stale_tile_config);
      amx::quant_matmul_fp32(w, x.data(), n, got.data(), pool);
    }
    size_t off = 0;
    for (size_t i = 0; i < got.size(); ++i)
      off += !(std::fabs(got[i] - want[i]) <= fp32_tol(mag[i], w.cols));
    EXPECT_GT(off, 0u) << block_format_name(f) << ": the stale config went unseen";
  }
}

// The AMX quantized prefill on the tile model against the same kernel on the
// silicon, bit for bit: every format (K = 16 and 32 groups, with and without
// mins), rows off the panel, token counts off the 32-token block.
TEST(QuantTest, AmxTileModelMatchesSilicon) {
  if (detect_isa() != Isa::amx)
    GTEST_SKIP() << "no AMX on this CPU: nothing to hold the tile model to (the amx tier's "
                    "tests run on it)";
  std::mt19937 rng(31);
  ThreadPool pool(2);
  const TileBackend saved = tile_backend();
  for (BlockFormat f : kFormats) {
    const QuantMatrix w = random_matrix(f, 45, 2 * block_elems(f), rng);
    for (size_t n : {16, 33, 70}) {
      const auto x = random_x(n * w.cols, rng);
      std::vector<float> silicon(n * w.rows), model(n * w.rows);
      set_tile_backend(TileBackend::silicon);
      amx::quant_matmul_fp32(w, x.data(), n, silicon.data(), pool);
      set_tile_backend(TileBackend::model);
      amx::quant_matmul_fp32(w, x.data(), n, model.data(), pool);
      set_tile_backend(saved);
      ASSERT_EQ(std::memcmp(silicon.data(), model.data(), silicon.size() * sizeof(float)), 0)
          << block_format_name(f) << " n=" << n;
    }
  }
}

// The bf16-activation kernels' check: kernel(w, x, n, y) against the scalar
// fp32 reference run on x rounded as the kernel rounds it (bf16, nearest even)
// for the segments `rounded` picks, on x itself for the others. Returns the
// largest |got - want| over the outputs in units of the fp32 tolerance, and
// the outputs in `got`; a write past the output fails the test.
template <class Kernel, class Rounded>
double bf16_worst(const QuantMatrix& w, const std::vector<float>& x, size_t n, Kernel kernel,
                  Rounded rounded, std::vector<float>& got) {
  SCOPED_TRACE("rows " + std::to_string(w.rows) + " cols " + std::to_string(w.cols) + " n " +
               std::to_string(n));
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) xr[i] = round_to_bf16(x[i]);
  std::vector<float> sums, sums_r;
  const Fp32Acts acts = fp32_acts(x, n, w.cols, sums), acts_r = fp32_acts(xr, n, w.cols, sums_r);
  std::vector<float> want(n * w.rows, NAN);
  size_t base = 0;
  for (const QuantSegment& s : w.segments) {
    ref::quant_rows_fp32(s, rounded(s) ? acts_r : acts, want.data() + base, w.rows, 0, s.rows);
    base += s.rows;
  }
  const auto mag = abs_products(w, xr, n);
  got.assign(n * w.rows + 1, NAN);
  got.back() = -7.0f;
  kernel(w, x.data(), n, got.data());
  EXPECT_EQ(got.back(), -7.0f) << "wrote past the output";
  got.pop_back();
  double ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    ratio = std::max(ratio, std::fabs(got[i] - want[i]) / fp32_tol(mag[i], w.cols));
  return ratio;
}

// The bf16-activation prefill GEMM (avx512 tier, the fast config) against the
// scalar fp32 reference run on x rounded as the kernel rounds it (bf16, nearest
// even): the same product up to fp32 summation order, on every format, rows
// off the 16-row panel, token counts off the 8-token tile, several segments.
// A kernel that rounds differently is far outside that tolerance: x truncated
// to bf16 (Fault::bf16_truncate) is shown to fail it.
using QuantBf16Fn = void (*)(const QuantMatrix&, const float*, size_t, float*, ThreadPool&);

// The amx tier's one-pass prefill (quant_amx.cpp, one bf16 part) is held to
// the same reference, n >= 16 (its A tiles), on silicon or on the tile model.
void check_bf16_prefill(QuantBf16Fn kernel, size_t min_tokens) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  // The largest |got - want| over the outputs, in units of the fp32 tolerance.
  auto worst = [&](const QuantMatrix& w, size_t n, const std::string& what) {
    SCOPED_TRACE(what);
    std::vector<float> got;
    return bf16_worst(
        w, random_x(n * w.cols, rng), n,
        [&](const QuantMatrix& m, const float* x, size_t k, float* y) { kernel(m, x, k, y, pool); },
        [](const QuantSegment&) { return true; }, got);
  };
  auto check = [&](const QuantMatrix& w, size_t n, const std::string& what) {
    if (n >= min_tokens) {
      EXPECT_LE(worst(w, n, what), 1.0) << "outside the fp32 tolerance";
    }
  };
  for (BlockFormat f : kFormats) {
    const size_t unit = block_elems(f);
    for (size_t rows : {5, 17, 45})
      for (size_t cols : {unit, 3 * unit}) {
        const QuantMatrix w = random_matrix(f, rows, cols, rng);
        for (size_t n : {1, 8, 17, 33, 70}) check(w, n, std::string(block_format_name(f)));
      }
  }
  QuantMatrix mixed;
  for (auto [f, rows] :
       {std::pair{BlockFormat::q4_k, size_t{40}}, std::pair{BlockFormat::q6_k, size_t{7}},
        std::pair{BlockFormat::q5_0, size_t{13}}, std::pair{BlockFormat::q2_k, size_t{19}},
        std::pair{BlockFormat::q5_1, size_t{21}}}) {
    const auto blocks = random_blocks(f, rows, 256, rng);
    append_segment(mixed, repack_gguf(f, blocks.data(), rows, 256));
  }
  for (size_t n : {9, 16, 40}) check(mixed, n, "mixed segments");
  // Truncating x instead of rounding it (Fault::bf16_truncate): caught.
  fault::Scoped truncate(fault::Fault::bf16_truncate);
  for (BlockFormat f : {BlockFormat::q4_0, BlockFormat::q5_0, BlockFormat::q8_0}) {
    const QuantMatrix w = random_matrix(f, 17, block_elems(f), rng);
    EXPECT_GT(worst(w, std::max<size_t>(min_tokens, 17), "truncated"), 1.0)
        << block_format_name(f) << ": truncation to bf16 went unnoticed";
  }
}

TEST(QuantTest, Bf16PrefillMatchesTheRoundedReference) {
  if (detect_isa() < Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU: not run";
  check_bf16_prefill(avx512::quant_matmul_bf16, 1);
}

TEST(QuantTest, AmxBf16PrefillMatchesTheRoundedReference) {
  if (runnable_isa() != Isa::amx) GTEST_SKIP() << "no amx tier (tiles or tile model): not run";
  SCOPED_TRACE(std::string("on ") + std::string(tile_backend_name(tile_backend())));
  check_bf16_prefill(amx::quant_matmul_bf16, amx::kMinQuantTokens);
}

// The fast config's quantized decode (avx512::quant_gemv_bf16): u4, u5 and c4
// segments against the scalar reference on x rounded to bf16 (nearest even), the other
// layouts against it on x itself; odd block counts (the last block paired with
// zeros), rows off the 4-row tile, 1..7 tokens (4-, 2- and 1-token tiles),
// several segments; no write past the output. n tokens at once equal n
// single-token calls bit for bit (batched decode). The check's power: with x
// truncated to bf16 instead (Fault::bf16_truncate) it fails.
TEST(QuantTest, Bf16GemvMatchesTheRoundedReference) {
  if (detect_isa() < Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU: not run";
  std::mt19937 rng(31);
  ThreadPool pool(2);
  // The largest |got - want| over the outputs, in units of the fp32 tolerance.
  auto worst = [&](const QuantMatrix& w, size_t n, const std::string& what) {
    SCOPED_TRACE(what);
    const auto x = random_x(n * w.cols, rng);
    std::vector<float> got;
    const double ratio = bf16_worst(
        w, x, n,
        [&](const QuantMatrix& m, const float* xs, size_t k, float* y) {
          avx512::quant_gemv_bf16(m, xs, k, y, pool);
        },
        [](const QuantSegment& s) { return s.layout != QuantLayout::i8; }, got);
    // Token by token: the same bits.
    std::vector<float> one(w.rows);
    for (size_t t = 0; t < n; ++t) {
      avx512::quant_gemv_bf16(w, x.data() + t * w.cols, 1, one.data(), pool);
      EXPECT_EQ(std::memcmp(one.data(), got.data() + t * w.rows, w.rows * sizeof(float)), 0)
          << "token " << t << " of " << n << " differs from its own GEMV";
    }
    return ratio;
  };
  std::vector<QuantMatrix> cases;
  for (BlockFormat f : kFormats) {
    const size_t unit = block_elems(f);
    for (size_t rows : {1, 5, 17})
      for (size_t cols : {unit, 3 * unit, 5 * unit})
        cases.push_back(random_matrix(f, rows, cols, rng));
  }
  QuantMatrix mixed;
  for (auto [f, rows] :
       {std::pair{BlockFormat::q4_k, size_t{9}}, std::pair{BlockFormat::q6_k, size_t{7}},
        std::pair{BlockFormat::q4_0, size_t{13}}, std::pair{BlockFormat::q5_0, size_t{6}},
        std::pair{BlockFormat::q4_1, size_t{3}}}) {
    const auto blocks = random_blocks(f, rows, 768, rng);
    append_segment(mixed, repack_gguf(f, blocks.data(), rows, 768));
  }
  cases.push_back(std::move(mixed));
  for (const QuantMatrix& w : cases)
    for (size_t n : {1, 2, 3, 7}) {
      const std::string what = w.segments.size() > 1 ? "mixed" : "one segment";
      EXPECT_LE(worst(w, n, what), 1.0) << "outside the fp32 tolerance";
    }
  // Truncating x instead of rounding it: caught on the u4, u5 and c4 formats.
  fault::Scoped truncate(fault::Fault::bf16_truncate);
  for (BlockFormat f : {BlockFormat::q4_0, BlockFormat::q4_1, BlockFormat::q4_k, BlockFormat::q5_0,
                        BlockFormat::q5_1, BlockFormat::iq4_nl, BlockFormat::mxfp4}) {
    double ratio = 0.0;
    for (size_t rows : {5, 17})
      ratio = std::max(ratio, worst(random_matrix(f, rows, block_elems(f), rng), 3, "truncated"));
    EXPECT_GT(ratio, 1.0) << block_format_name(f) << ": truncation to bf16 went unnoticed";
  }
}

// Rows of no columns (the per-row prefetch divides its distance by the row's
// bytes): every output 0, no fault.
TEST(QuantTest, Bf16GemvOfNoColumnsIsZero) {
  if (detect_isa() < Isa::avx512) GTEST_SKIP() << "no AVX-512 BF16 on this CPU: not run";
  std::mt19937 rng(37);
  ThreadPool pool(2);
  const QuantMatrix w = random_matrix(BlockFormat::q4_0, 5, 0, rng);
  std::vector<float> y(2 * w.rows, NAN);
  avx512::quant_gemv_bf16(w, nullptr, 2, y.data(), pool);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// The AMX prefill GEMM (n >= 16 on the amx tier) against the scalar fp32
// reference: every format, rows not a multiple of the 16-row panel or the
// 32-row block, token counts not a multiple of the 32-token block, and a
// matrix of several segments (q, k and v in different formats).
TEST(QuantTest, AmxPrefillMatchesTheReference) {
  if (runnable_isa() != Isa::amx) GTEST_SKIP() << "no amx tier (tiles or tile model): not run";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  PrecisionScope precision(QuantPrecision::fp32);
  IsaScope scope(Isa::amx);
  auto check = [&](const QuantMatrix& w, size_t n, const std::string& what) {
    SCOPED_TRACE(what + " rows " + std::to_string(w.rows) + " cols " + std::to_string(w.cols) +
                 " n " + std::to_string(n));
    const auto x = random_x(n * w.cols, rng);
    std::vector<float> sums;
    const Fp32Acts acts = fp32_acts(x, n, w.cols, sums);
    std::vector<float> want(n * w.rows, NAN);
    size_t base = 0;
    for (const QuantSegment& s : w.segments) {
      ref::quant_rows_fp32(s, acts, want.data() + base, w.rows, 0, s.rows);
      base += s.rows;
    }
    const auto mag = abs_products(w, x, n);
    std::vector<float> got(n * w.rows, NAN), via(n * w.rows, NAN);
    amx::quant_matmul_fp32(w, x.data(), n, got.data(), pool);
    quant_matmul(w, x.data(), n, via.data(), nullptr, pool);  // the dispatch takes it too
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], fp32_tol(mag[i], w.cols)) << "at " << i;
      ASSERT_EQ(via[i], got[i]) << "dispatch at " << i;
    }
  };
  for (BlockFormat f : kFormats) {
    const size_t unit = block_elems(f);
    for (size_t rows : {5, 17, 45}) {
      for (size_t cols : {unit, 3 * unit}) {
        const QuantMatrix w = random_matrix(f, rows, cols, rng);
        for (size_t n : {16, 17, 33, 100}) check(w, n, std::string(block_format_name(f)));
      }
    }
  }
  // --weights q8_0 / q4_0: rows quantized at setup.
  for (BlockFormat f : {BlockFormat::q8_0, BlockFormat::q4_0}) {
    QuantMatrix w;
    const auto src = random_x(37 * 96, rng);
    append_segment(w, quantize_rows(f, src.data(), 37, 96));
    for (size_t n : {17, 33}) check(w, n, "quantize_rows " + std::string(block_format_name(f)));
  }
  // Several segments of different layouts and group sizes in one matrix.
  QuantMatrix mixed;
  for (auto [f, rows] : {std::pair{BlockFormat::q4_k, size_t{40}},
                         {BlockFormat::q6_k, 19},
                         {BlockFormat::q5_0, 7},
                         {BlockFormat::q2_k, 21},
                         {BlockFormat::q5_k, 9},
                         {BlockFormat::q4_1, 33},
                         {BlockFormat::q5_1, 11}}) {
    const auto blocks = random_blocks(f, rows, 512, rng);
    append_segment(mixed, repack_gguf(f, blocks.data(), rows, 512));
  }
  for (size_t n : {17, 100}) check(mixed, n, "mixed segments");
  // Long rows (the 1B fixture's down projection with --weights): several
  // panel chunks per thread and several token blocks, an odd last chunk.
  for (BlockFormat f : {BlockFormat::q8_0, BlockFormat::q4_1}) {
    const QuantMatrix w = random_matrix(f, 150, 8192, rng);
    check(w, 40, "long rows " + std::string(block_format_name(f)));
  }
}

}  // namespace
}  // namespace edgellm::kernels
