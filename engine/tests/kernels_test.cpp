// Optimized kernels against the scalar references (kernels/reference.cpp).
//
// Each suite is instantiated once per ISA tier that has its own path for the
// kernel (registered_kernels()), and reports a skip for a tier this CPU lacks.
// An instance sets the tier (set_isa) and calls the public dispatching
// function, so "avx512" means "what dispatch runs on avx512". Where the
// scalar dispatch IS the reference (every kernel but matmul) there is no
// scalar instance: it would compare the reference with itself. The scalar
// matmul instance checks dispatch's row-split, thread-parallel scalar loop.
// Inputs: odd sizes (not multiples of the vector width or the panel),
// misaligned pointers (float* offset by one), a few model-sized shapes; every
// output buffer has guard values before and after it.
//
// Tolerances come from fp32 rounding: a dot product of K terms summed in a
// different order differs by at most about K * eps * sum|a_i b_i| in the worst
// case and sqrt(K) * eps * sum|a_i b_i| in practice; 1e-5 * sum|a_i b_i| is
// ~84 eps, which covers K up to 8192 (sqrt(8192) = 90) with margin. Tiers that
// round activations to bf16 (avx512/amx GEMM) are held to the reference run on
// the same bf16-rounded x, with that same tolerance; a separate test bounds
// their distance to the fp32-x reference by the bf16 rounding itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "edgellm/bf16.h"
#include "edgellm/thread_pool.h"
#include "kernels/avx2.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/kernels.h"
#include "sanitized.h"

namespace edgellm::kernels {
namespace {

constexpr float kEps = std::numeric_limits<float>::epsilon();

// The tiers with their own path for `kernel`, scalar only where the scalar
// dispatch is not the reference itself (see the file comment).
std::vector<Isa> tiers_of(std::string_view kernel) {
  for (const KernelInfo& k : registered_kernels()) {
    if (k.name != kernel) continue;
    std::vector<Isa> tiers;
    for (Isa isa : k.paths)
      if (isa != Isa::scalar || kernel == "matmul") tiers.push_back(isa);
    return tiers;
  }
  ADD_FAILURE() << "kernel " << kernel << " is not registered";
  return {};
}

std::string tier_name(const ::testing::TestParamInfo<Isa>& info) {
  return std::string(isa_name(info.param));
}

// Sets the active ISA for a scope.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(active_isa()) { set_isa(isa); }
  ~IsaScope() { set_isa(saved_); }

 private:
  Isa saved_;
};

// A test run on one tier, skipped (and reported so) when the CPU lacks it.
class TierTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (GetParam() > runnable_isa())
      GTEST_SKIP() << "this CPU/OS lacks the " << isa_name(GetParam()) << " tier (best is "
                   << isa_name(runnable_isa()) << ")";
  }
  Isa isa() const { return GetParam(); }
};

// A float buffer whose data() is deliberately misaligned by one float (4 bytes
// off any vector boundary), with a guard value before the start and after the
// end to catch out-of-bounds stores.
class OddBuffer {
 public:
  explicit OddBuffer(size_t n, float fill = 0.0f) : buf_(n + 2, fill), n_(n) {
    buf_[0] = kGuard;
    buf_[n + 1] = kGuard;
  }
  float* data() { return buf_.data() + 1; }
  const float* data() const { return buf_.data() + 1; }
  float& operator[](size_t i) { return buf_[i + 1]; }
  float operator[](size_t i) const { return buf_[i + 1]; }
  size_t size() const { return n_; }
  bool guard_intact() const { return buf_[0] == kGuard && buf_[n_ + 1] == kGuard; }

 private:
  static constexpr float kGuard = 12345.678f;
  std::vector<float> buf_;
  size_t n_;
};

OddBuffer random_buffer(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  OddBuffer b(n);
  for (size_t i = 0; i < n; ++i) b[i] = dist(rng);
  return b;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = float_to_bf16(dist(rng));
  return v;
}

ThreadPool& test_pool() {
  // Three threads even on a 2-core machine: more chunks than cores exercises
  // the uneven splits and the dynamic claiming.
  static ThreadPool pool(3);
  return pool;
}

// --- matmul -------------------------------------------------------------------

// x split into `parts` bf16 parts and summed back (0 parts: x itself), in
// scalar code: what avx512::to_bf16_parts hands the AMX tiles. The sum is
// exact in fp32 (at most 3 x 8 significant bits within 24).
float split_sum(float x, size_t parts) {
  if (parts == 0) return x;
  float sum = 0.0f, rest = x;
  for (size_t p = 0; p < parts; ++p) {
    const float part = round_to_bf16(rest);
    sum += part;
    rest -= part;
  }
  return sum;
}

// How many bf16 parts `isa`'s matmul splits x into for n tokens at the
// current precision (see kernels.h); 0 = x stays fp32.
size_t activation_parts(Isa isa, size_t n) {
  if (isa == Isa::amx && n >= amx::kMinTokens) return amx::amx_parts(gemm_precision());
  return isa >= Isa::avx512 && n > 1 && gemm_precision() == GemmPrecision::bf16 ? 1 : 0;
}
// Whether that loses bits of x (3 parts hold every fp32 exactly).
bool rounds_activations(Isa isa, size_t n) {
  const size_t parts = activation_parts(isa, n);
  return parts == 1 || parts == 2;
}

// Sets the GEMM activation precision for a scope.
class PrecisionScope {
 public:
  explicit PrecisionScope(GemmPrecision p) : saved_(gemm_precision()) { set_gemm_precision(p); }
  ~PrecisionScope() { set_gemm_precision(saved_); }

 private:
  GemmPrecision saved_;
};

// The avx512 bf16 GEMM (vdpbf16ps, matmul_avx512.cpp) sums each output as one
// fp32 chain over the column pairs in order: acc <- acc + p_2q + p_2q+1, the
// products exact (8 x 8 significant bits), at most one rounding per addition
// (two per pair in either order, or the pair's sum first, or one fused), then
// y = acc + bias. A rounding errs by at most u = 2^-24 times the value it
// rounds, so to first order, with m_q = max(|S_2q + p_2q|, |S_2q + p_2q+1|,
// |p_2q + p_2q+1|),
//   |y - exact| <= u * (sum_q (m_q + |S_2q+2|) + |y|)
// with S_k the exact partial sums (in double): the rounding-aware bound of the
// check below, derived per output from the terms themselves. On random
// signs the partial sums grow like sqrt(k), so it is ~0.7 sqrt(K) u sum|w x|
// (simulated): 4e-7 sum|w x| at K = 64, 4e-6 at K = 8192, where the generic
// check allows 1e-5.
struct Bf16Chain {
  double value = 0.0, bound = 0.0;
};
Bf16Chain bf16_chain(const uint16_t* w_row, const float* x_seen, size_t cols, double bias) {
  constexpr double u = 0x1p-24;
  Bf16Chain c;
  for (size_t q = 0; 2 * q < cols; ++q) {
    const double a = static_cast<double>(bf16_to_float(w_row[2 * q])) * x_seen[2 * q];
    const double b = 2 * q + 1 < cols
                         ? static_cast<double>(bf16_to_float(w_row[2 * q + 1])) * x_seen[2 * q + 1]
                         : 0.0;
    const double m = std::max({std::fabs(c.value + a), std::fabs(c.value + b), std::fabs(a + b)});
    c.bound += u * (m + std::fabs(c.value + a + b));
    c.value += a + b;
  }
  c.value += bias;
  c.bound += u * std::fabs(c.value);
  // Second order: the rounded partial sums exceed the exact ones by at most
  // the error so far (< K u of them).
  c.bound *= 1.0 + 0x1p-24 * static_cast<double>(cols + 2) + 1e-12;
  return c;
}

// Whether `isa` runs the avx512 vdpbf16ps GEMM for n tokens at the current
// precision (amx runs it below kMinTokens, but its own tiles above).
bool runs_avx512_bf16_gemm(Isa isa, size_t n) {
  return isa == Isa::avx512 && n > 1 && gemm_precision() == GemmPrecision::bf16;
}

// Checks matmul(isa) against ref::matmul for one shape; returns false (after
// reporting, unless `report` is false) on the first mismatch so sweeps stop
// early. The reference sees x exactly as the tier does (bf16-rounded, or the
// sum of its bf16 parts). The avx512 bf16 GEMM is held to the rounding-aware
// bound of its fp32 chain (bf16_chain); every other path to 1e-5 sum|w x|.
// `worst` (if given) collects the largest |error| / tolerance seen.
bool check_matmul(Isa isa, size_t rows, size_t cols, size_t n, bool with_bias, std::mt19937& rng,
                  ThreadPool& pool, bool report = true, double* worst = nullptr) {
  const std::vector<uint16_t> w = random_bf16(rows * cols, rng);
  const OddBuffer x = random_buffer(n * cols, rng);
  const OddBuffer bias = random_buffer(rows, rng);
  std::vector<float> x_seen(x.data(), x.data() + n * cols);
  for (float& v : x_seen) v = split_sum(v, activation_parts(isa, n));

  PackedMatrix ref_w = pack_matrix(w.data(), rows, cols, Isa::scalar);
  PackedMatrix opt_w = pack_matrix(w.data(), rows, cols, isa);
  EXPECT_EQ(opt_w.isa, isa);
  if (with_bias) ref_w.bias = opt_w.bias = bias.data();

  std::vector<float> expected(n * rows);
  ref::matmul(ref_w, x_seen.data(), n, expected.data());
  OddBuffer got(n * rows, std::nanf(""));
  {
    IsaScope scope(isa);
    matmul(opt_w, x.data(), n, got.data(), pool);
  }
  EXPECT_TRUE(got.guard_intact()) << "store out of bounds";
  const bool chain = runs_avx512_bf16_gemm(isa, n);
  for (size_t t = 0; t < n; ++t) {
    for (size_t r = 0; r < rows; ++r) {
      double e = expected[t * rows + r], tol;
      if (chain) {
        const Bf16Chain c = bf16_chain(w.data() + r * cols, x_seen.data() + t * cols, cols,
                                       with_bias ? static_cast<double>(bias[r]) : 0.0);
        e = c.value;
        tol = c.bound;
      } else {
        double mag = with_bias ? std::fabs(bias[r]) : 0.0;
        for (size_t c = 0; c < cols; ++c)
          mag += std::fabs(bf16_to_float(w[r * cols + c]) * x_seen[t * cols + c]);
        tol = 1e-5 * mag + 1e-30;
      }
      const float g = got[t * rows + r];
      const double err = std::fabs(e - g);
      if (worst && tol > 0) *worst = std::max(*worst, err / tol);
      if (!(err <= tol)) {
        if (report)
          ADD_FAILURE() << isa_name(isa) << " rows=" << rows << " cols=" << cols << " n=" << n
                        << " bias=" << with_bias << " at t=" << t << " r=" << r << ": got " << g
                        << " want " << e << " tol " << tol;
        return false;
      }
    }
  }
  return true;
}

class KernelMatmul : public TierTest {};

TEST_P(KernelMatmul, OddShapesSweep) {
  std::mt19937 rng(1);
  for (size_t rows = 1; rows <= 37; ++rows) {
    for (size_t cols = 1; cols <= 70; ++cols) {
      // GEMV, a GEMM with 2..9 tokens (partial register tiles), and on every
      // fifth shape one of 16..55 tokens (AMX tiles, partial 32-token blocks).
      const size_t n = 2 + (rows * 7 + cols) % 8;
      const bool bias = (rows + cols) % 3 == 0;
      ASSERT_TRUE(check_matmul(isa(), rows, cols, 1, bias, rng, test_pool()));
      ASSERT_TRUE(check_matmul(isa(), rows, cols, n, !bias, rng, test_pool()));
      if ((rows + cols) % 5 == 0) {
        ASSERT_TRUE(
            check_matmul(isa(), rows, cols, 16 + (rows * 3 + cols) % 40, bias, rng, test_pool()));
      }
    }
  }
}

// Odd and model shapes at a reduced precision; check_matmul compares with the
// reference on x as the tier sees it (rounded, or the sum of its parts).
void check_precision_shapes(Isa isa, GemmPrecision p, unsigned seed) {
  PrecisionScope precision(p);
  std::mt19937 rng(seed);
  ThreadPool pool2(2);
  for (size_t rows = 1; rows <= 37; rows += 3) {
    for (size_t cols = 1; cols <= 70; cols += 2) {
      ASSERT_TRUE(
          check_matmul(isa, rows, cols, 2 + (rows + cols) % 13, cols % 3 == 0, rng, test_pool()));
      ASSERT_TRUE(
          check_matmul(isa, rows, cols, 16 + (rows + cols) % 21, cols % 3 == 1, rng, test_pool()));
    }
  }
  EXPECT_TRUE(check_matmul(isa, 576, 1536, 64, false, rng, pool2));
  EXPECT_TRUE(check_matmul(isa, 40, 8192, 70, true, rng, pool2));
  EXPECT_TRUE(check_matmul(isa, 5, 0, 20, true, rng, pool2));
}

// EDGELLM_GEMM_PRECISION=bf16: x rounded to bf16 (the avx512/amx GEMM).
TEST_P(KernelMatmul, Bf16PrecisionShapes) {
  check_precision_shapes(isa(), GemmPrecision::bf16, 19);
}

// The avx512 bf16 GEMM on the shapes its blocking has edges at, against its
// rounding-aware bound (bf16_chain): n not a multiple of the 12-token tile,
// rows not a multiple of the 32-row panel pair (odd panel counts), cols odd
// and < 32 (one zero-padded chunk), several K blocks (cols > 2048, unequal)
// and token blocks, bias on and off, 1, 2 and 3 threads.
TEST_P(KernelMatmul, Bf16GemmRoundingAware) {
  PrecisionScope precision(GemmPrecision::bf16);
  if (!runs_avx512_bf16_gemm(isa(), 2)) GTEST_SKIP() << isa_name(isa()) << " has no such path";
  std::mt19937 rng(31);
  ThreadPool one(1), two(2);
  ThreadPool* pools[] = {&one, &two, &test_pool()};
  double worst = 0.0;
  size_t i = 0;
  for (size_t n : {2, 11, 13, 25, 37})
    for (size_t rows : {1, 15, 17, 33, 47, 80})
      for (size_t cols : {1, 2, 3, 31, 33, 63, 100, 577}) {
        ThreadPool& pool = *pools[i % 3];
        ASSERT_TRUE(check_matmul(isa(), rows, cols, n, ++i % 2 == 0, rng, pool, true, &worst));
      }
  // Three K blocks of 43 chunks (the last chunk 4 columns), two token blocks.
  ASSERT_TRUE(check_matmul(isa(), 37, 4100, 200, true, rng, two, true, &worst));
  ASSERT_TRUE(check_matmul(isa(), 50, 8192, 30, false, rng, one, true, &worst));
  std::printf("[ bf16     ] worst |err| / rounding-aware bound: %.3f\n", worst);
}

// The rounding-aware check fails on the real kernel with each fault on (and
// passes on the same data without): truncating x instead of rounding it, and
// leaving the last K chunk (32 columns) out of the sum.
// With each fault on, check_matmul fails on every shape; without, it passes
// on the same data.
void expect_gemm_faults_caught(Isa isa,
                               std::initializer_list<std::tuple<size_t, size_t, size_t>> shapes) {
  ThreadPool two(2);
  for (const fault::Fault f :
       {fault::Fault::none, fault::Fault::bf16_truncate, fault::Fault::drop_k_tail}) {
    for (const auto& [rows, cols, n] : shapes) {
      std::mt19937 rng(37);
      fault::Scoped scoped(f);
      const bool passed = check_matmul(isa, rows, cols, n, true, rng, two, false);
      EXPECT_EQ(passed, f == fault::Fault::none)
          << fault::name(f) << " " << rows << "x" << cols << " n=" << n;
    }
  }
}

TEST_P(KernelMatmul, Bf16GemmFaultsAreCaught) {
  PrecisionScope precision(GemmPrecision::bf16);
  if (!runs_avx512_bf16_gemm(isa(), 2)) GTEST_SKIP() << isa_name(isa()) << " has no such path";
  expect_gemm_faults_caught(isa(), {{17, 40, 5}, {33, 577, 13}, {37, 4100, 30}, {5, 3, 2}});
}

// EDGELLM_GEMM_PRECISION=bf16x2: two bf16 parts on amx, fp32 elsewhere.
TEST_P(KernelMatmul, Bf16x2PrecisionShapes) {
  check_precision_shapes(isa(), GemmPrecision::bf16x2, 23);
}

TEST_P(KernelMatmul, EmptyShapes) {
  std::mt19937 rng(2);
  for (size_t n : {1, 3, 40}) {
    EXPECT_TRUE(check_matmul(isa(), 0, 5, n, false, rng, test_pool()));
    EXPECT_TRUE(check_matmul(isa(), 5, 0, n, true, rng, test_pool()));
  }
  EXPECT_TRUE(check_matmul(isa(), 5, 7, 0, false, rng, test_pool()));
}

TEST_P(KernelMatmul, ModelShapes) {
  std::mt19937 rng(3);
  ThreadPool pool2(2);
  // SmolLM2 projections, decode and prefill.
  EXPECT_TRUE(check_matmul(isa(), 1536, 576, 1, false, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 576, 1536, 1, true, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 1536, 576, 37, false, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 576, 1536, 64, false, rng, pool2));
  // More tokens than one token block, and Llama's K = 8192 (many k-blocks).
  EXPECT_TRUE(check_matmul(isa(), 50, 300, 200, true, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 40, 8192, 13, false, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 40, 8192, 70, false, rng, pool2));
  EXPECT_TRUE(check_matmul(isa(), 2048, 64, 1, false, rng, test_pool()));
  EXPECT_TRUE(check_matmul(isa(), 67, 8192, 1, false, rng, test_pool()));
}

// The AMX GEMM's blocking edges: several K slices (K > 640, unequal last
// slice) with partial token and row blocks carried between slices, more
// panel pairs than one B group, threads split by tokens (>= 2 blocks of 32
// each) and by panels, and more tokens than one worker's token block.
TEST_P(KernelMatmul, BlockingEdges) {
  std::mt19937 rng(8);
  ThreadPool pool2(2);
  // (A thread's x over 1 MiB as 3 parts is sliced: 96 tokens x 2208 columns, 64 x 3008.)
  EXPECT_TRUE(check_matmul(isa(), 50, 2200, 161, true, rng, pool2));  // tokens split, 5 slices
  EXPECT_TRUE(check_matmul(isa(), 50, 3000, 40, false, rng, pool2));  // panels split, 6 slices
  EXPECT_TRUE(check_matmul(isa(), 337, 1100, 200, false, rng, test_pool()));  // 2 groups
  EXPECT_TRUE(check_matmul(isa(), 337, 900, 700, true, rng, test_pool()));    // 2 slices
  EXPECT_TRUE(check_matmul(isa(), 40, 576, 700, true, rng, pool2));           // 2 token blocks each
  EXPECT_TRUE(check_matmul(isa(), 47, 64, 128, false, rng, pool2));  // exactly 2 blocks each
}

TEST_P(KernelMatmul, SingleThreadPool) {
  std::mt19937 rng(4);
  ThreadPool serial(1);
  EXPECT_TRUE(check_matmul(isa(), 33, 65, 1, true, rng, serial));
  EXPECT_TRUE(check_matmul(isa(), 33, 65, 8, false, rng, serial));
  EXPECT_TRUE(check_matmul(isa(), 33, 65, 33, false, rng, serial));
}

TEST_P(KernelMatmul, PackRoundTrip) {
  std::mt19937 rng(5);
  for (size_t rows : {1, 15, 16, 17, 40}) {
    for (size_t cols : {1, 9, 33, 64}) {
      const std::vector<uint16_t> w = random_bf16(rows * cols, rng);
      const PackedMatrix m = pack_matrix(w.data(), rows, cols, isa());
      EXPECT_EQ(m.rows, rows);
      EXPECT_EQ(m.cols, cols);
      EXPECT_GE(m.byte_size(), rows * cols * sizeof(uint16_t));
      EXPECT_LE(m.byte_size(), m.data.size() * sizeof(uint16_t));
      std::vector<float> row(cols);
      for (size_t r = 0; r < rows; ++r) {
        unpack_row(m, r, row.data());
        for (size_t c = 0; c < cols; ++c)
          ASSERT_EQ(row[c], bf16_to_float(w[r * cols + c])) << isa_name(isa()) << " r=" << r;
      }
    }
  }
}

// The distance of `isa`'s matmul (at the current precision) to the fp32-x
// reference on random data: the largest error as a fraction of sum|w x|, and
// the largest absolute error.
struct MatmulError {
  double relative = 0.0, absolute = 0.0;
};
MatmulError error_vs_fp32(Isa isa, size_t rows, size_t cols, size_t n, std::mt19937& rng,
                          ThreadPool& pool) {
  const std::vector<uint16_t> w = random_bf16(rows * cols, rng);
  const OddBuffer x = random_buffer(n * cols, rng);
  const PackedMatrix ref_w = pack_matrix(w.data(), rows, cols, Isa::scalar);
  const PackedMatrix opt_w = pack_matrix(w.data(), rows, cols, isa);
  std::vector<float> want(n * rows), got(n * rows);
  ref::matmul(ref_w, x.data(), n, want.data());
  {
    IsaScope scope(isa);
    matmul(opt_w, x.data(), n, got.data(), pool);
  }
  MatmulError e;
  for (size_t t = 0; t < n; ++t)
    for (size_t r = 0; r < rows; ++r) {
      double mag = 0.0;
      for (size_t c = 0; c < cols; ++c)
        mag += std::fabs(bf16_to_float(w[r * cols + c]) * x[t * cols + c]);
      const double d = std::fabs(got[t * rows + r] - want[t * rows + r]);
      e.relative = std::max(e.relative, d / mag);
      e.absolute = std::max(e.absolute, d);
    }
  return e;
}

// Model shapes (SmolLM2's projections, Llama's K = 8192), so a systematic
// error (a dropped column block, a wrong pair, a missing part) shows.
constexpr std::tuple<size_t, size_t, size_t> kErrorShapes[] = {
    {576, 1536, 48}, {1536, 576, 17}, {96, 8192, 33}};

// The bf16 rounding of x costs at most 2^-8 relative per term (round to
// nearest with 8 significant bits), so the distance to the fp32-x reference is
// bounded by 2^-8 * sum|w x| (+ the fp32 summation term).
TEST_P(KernelMatmul, Bf16ActivationErrorBound) {
  PrecisionScope precision(GemmPrecision::bf16);
  if (!rounds_activations(isa(), 2)) GTEST_SKIP() << isa_name(isa()) << " keeps x in fp32";
  std::mt19937 rng(17);
  ThreadPool pool2(2);
  for (const auto& [rows, cols, n] : kErrorShapes) {
    const double worst = error_vs_fp32(isa(), rows, cols, n, rng, pool2).relative;
    EXPECT_LE(worst, 1.0 / 256 + 1e-5) << rows << "x" << cols << " n=" << n;
    // And the rounding really happens (else the tier would not be bf16):
    // random x loses ~2^-9 relative per term, far above the fp32 floor.
    EXPECT_GT(worst, 1e-5) << rows << "x" << cols << " n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KernelMatmul, ::testing::ValuesIn(tiers_of("matmul")), tier_name);

// AMX's split of x into bf16 parts, against the fp32-x reference (the numbers
// in docs/benchmarks.md come from this test's output). Three parts are exact,
// so only the fp32 sums remain: within check_matmul's fp32 tolerance (1e-5
// sum|w x|). TDPBF16PS's own accumulation was measured at 2-6x the avx512 FMA
// GEMM's worst error (printed, not asserted: both are a few fp32 ulps of
// sum|w x|). Two parts keep ~16 bits (2^-16 relative per term): at K = 64 the
// dropped bits show above the sums' rounding; at K >= 576 they average out.
TEST(KernelMatmulAmxSplit, ErrorAgainstFp32PerPartCount) {
  if (runnable_isa() < Isa::amx)
    GTEST_SKIP() << "this CPU/OS lacks the amx tier (best is " << isa_name(runnable_isa()) << ")";
  ThreadPool pool2(2);
  constexpr std::tuple<size_t, size_t, size_t> kSmallK{64, 64, 40};
  for (const auto& shape : {kSmallK, kErrorShapes[0], kErrorShapes[1], kErrorShapes[2]}) {
    const auto& [rows, cols, n] = shape;
    MatmulError fma, by_parts[4];
    {
      PrecisionScope precision(GemmPrecision::fp32);
      std::mt19937 rng(29);
      fma = error_vs_fp32(Isa::avx512, rows, cols, n, rng, pool2);
    }
    const GemmPrecision precisions[] = {GemmPrecision::bf16, GemmPrecision::bf16x2,
                                        GemmPrecision::fp32};
    for (GemmPrecision p : precisions) {
      PrecisionScope precision(p);
      std::mt19937 rng(29);  // the same W and x for every part count
      by_parts[amx::amx_parts(p)] = error_vs_fp32(Isa::amx, rows, cols, n, rng, pool2);
    }
    std::printf(
        "[ split    ] %zux%zu n=%zu worst |err| / sum|wx| (max |err|): avx512 fma %.2e (%.2e), "
        "amx 1 part %.2e (%.2e), 2 parts %.2e (%.2e), 3 parts %.2e (%.2e)\n",
        rows, cols, n, fma.relative, fma.absolute, by_parts[1].relative, by_parts[1].absolute,
        by_parts[2].relative, by_parts[2].absolute, by_parts[3].relative, by_parts[3].absolute);
    const std::string where =
        std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n);
    EXPECT_LE(by_parts[3].relative, 1e-5) << where;
    EXPECT_LE(by_parts[2].relative, std::ldexp(1.0, -16) + 1e-5) << where;
    EXPECT_GT(by_parts[1].relative, by_parts[2].relative) << where;
    if (shape == kSmallK) {
      EXPECT_GT(by_parts[2].relative, 2 * by_parts[3].relative) << where;
    }
  }
}

// to_bf16_parts against the scalar split, over a wide range of magnitudes:
// plane p holds part p bit for bit, padding is zero, and three parts sum back
// to x exactly.
TEST(KernelMatmulAmxSplit, PartsMatchScalarSplit) {
  if (detect_isa() < Isa::avx512)
    GTEST_SKIP() << "this CPU/OS lacks the avx512 tier (best is " << isa_name(detect_isa()) << ")";
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-90, 90);
  const size_t n = 5, cols = 37, n_pad = 32, cols_pad = 64;
  OddBuffer x(n * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(mant(rng), expo(rng));
  for (size_t parts = 1; parts <= 3; ++parts) {
    std::vector<uint16_t> out(parts * n_pad * cols_pad + 32, 0xffff);
    avx512::to_bf16_parts(x.data(), n, cols, n_pad, cols_pad, parts, out.data(), test_pool());
    for (size_t t = 0; t < n_pad; ++t)
      for (size_t c = 0; c < cols_pad; ++c) {
        float rest = t < n && c < cols ? x[t * cols + c] : 0.0f, sum = 0.0f;
        for (size_t p = 0; p < parts; ++p) {
          const uint16_t want = float_to_bf16(rest);
          const uint16_t got = out[p * n_pad * cols_pad + t * cols_pad + c];
          ASSERT_EQ(got, want) << "parts=" << parts << " p=" << p << " t=" << t << " c=" << c;
          sum += bf16_to_float(got);
          rest -= bf16_to_float(got);
        }
        if (parts == 3 && t < n && c < cols) {
          ASSERT_EQ(sum, x[t * cols + c]) << t << "," << c;
        }
      }
  }
}

// to_bf16_tiles against the scalar split: every element of every part at its
// tile position, zeros past n and cols, for a column range starting inside x
// (c0 > 0) and one running past its end.
TEST(KernelMatmulAmxSplit, TilesMatchScalarSplit) {
  if (detect_isa() < Isa::avx512)
    GTEST_SKIP() << "this CPU/OS lacks the avx512 tier (best is " << isa_name(detect_isa()) << ")";
  std::mt19937 rng(37);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-90, 90);
  const size_t n = 45, cols = 101, n_pad = 64;
  OddBuffer x(n * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(mant(rng), expo(rng));
  for (size_t parts = 1; parts <= 3; ++parts) {
    for (const auto& [c0, steps] : {std::pair<size_t, size_t>{0, 4}, {32, 3}, {64, 1}}) {
      std::vector<uint16_t> buf(parts * n_pad * steps * 32 + 32, 0xffff);
      uint16_t* out = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64 / 2;
      avx512::to_bf16_tiles(x.data(), n, cols, n_pad, c0, steps, parts, out);
      for (size_t t = 0; t < n_pad; ++t)
        for (size_t c = 0; c < steps * 32; ++c) {
          float rest = t < n && c0 + c < cols ? x[t * cols + c0 + c] : 0.0f;
          for (size_t p = 0; p < parts; ++p) {
            const uint16_t want = float_to_bf16(rest);
            const size_t at = (((t / 32 * steps + c / 32) * parts + p) * 2 + t % 32 / 16) * 512 +
                              t % 16 * 32 + c % 32;
            ASSERT_EQ(out[at], want)
                << "parts=" << parts << " c0=" << c0 << " p=" << p << " t=" << t << " c=" << c;
            rest -= bf16_to_float(out[at]);
          }
        }
    }
  }
}

// The AMX GEMM's fault points, on the amx tier's own path (n >= kMinTokens,
// one bf16 part, so the x rounding shows): truncating x instead of rounding
// it, and leaving the last K step (32 columns) out, each fail check_matmul's
// reference run on x rounded as the kernel rounds it; the same data passes
// without a fault.
TEST_P(KernelMatmul, AmxGemmFaultsAreCaught) {
  if (isa() != Isa::amx) GTEST_SKIP() << isa_name(isa()) << " has no AMX GEMM";
  PrecisionScope precision(GemmPrecision::bf16);
  SCOPED_TRACE(std::string("on ") + std::string(tile_backend_name(tile_backend())));
  expect_gemm_faults_caught(isa(), {{17, 40, 16}, {33, 577, 37}, {47, 1300, 70}, {5, 3, 33}});
}

// Sets the tile back end for a scope.
class TileBackendScope {
 public:
  explicit TileBackendScope(TileBackend b) : saved_(tile_backend()) { set_tile_backend(b); }
  ~TileBackendScope() { set_tile_backend(saved_); }

 private:
  TileBackend saved_;
};

constexpr const char* kNoAmxSilicon =
    "no AMX on this CPU: nothing to hold the tile model to (the amx tier's tests run on it)";

// The AMX GEMM on the tile model against the same GEMM on the silicon, bit for
// bit: every part count, bias on and off, odd rows / columns / tokens, a lone
// last panel, K in several slices (K > 640 with a large x), both thread splits.
TEST(AmxTilesMatchSilicon, Matmul) {
  if (detect_isa() != Isa::amx) GTEST_SKIP() << kNoAmxSilicon;
  std::mt19937 rng(45);
  ThreadPool two(2);
  constexpr std::tuple<size_t, size_t, size_t> kShapes[] = {
      {1, 1, 16}, {17, 33, 17}, {47, 577, 37}, {33, 700, 70}, {40, 2080, 160}, {16, 64, 200}};
  for (GemmPrecision p : {GemmPrecision::bf16, GemmPrecision::bf16x2, GemmPrecision::fp32}) {
    for (const auto& [rows, cols, n] : kShapes) {
      const std::vector<uint16_t> w = random_bf16(rows * cols, rng);
      const OddBuffer x = random_buffer(n * cols, rng);
      const OddBuffer bias = random_buffer(rows, rng);
      for (bool with_bias : {false, true}) {
        PackedMatrix m = pack_matrix(w.data(), rows, cols, Isa::amx);
        if (with_bias) m.bias = bias.data();
        std::vector<float> silicon(n * rows), model(n * rows);
        {
          TileBackendScope on(TileBackend::silicon);
          amx::matmul(m, x.data(), n, silicon.data(), two, p);
        }
        {
          TileBackendScope on(TileBackend::model);
          amx::matmul(m, x.data(), n, model.data(), two, p);
        }
        ASSERT_EQ(std::memcmp(silicon.data(), model.data(), silicon.size() * sizeof(float)), 0)
            << gemm_precision_name(p) << " " << rows << "x" << cols << " n=" << n
            << (with_bias ? " bias" : "");
      }
    }
  }
}

// A matrix packed for a SIMD tier keeps working after set_isa(scalar): the
// layout, not the active ISA, picks the kernel.
TEST(KernelMatmulLayout, LayoutPicksKernel) {
  if (detect_isa() < Isa::avx2) GTEST_SKIP() << "no SIMD tier on this CPU";
  std::mt19937 rng(6);
  const std::vector<uint16_t> w = random_bf16(20 * 30, rng);
  const OddBuffer x = random_buffer(30, rng);
  const PackedMatrix ref_w = pack_matrix(w.data(), 20, 30, Isa::scalar);
  const PackedMatrix opt_w = pack_matrix(w.data(), 20, 30, detect_isa());
  std::vector<float> want(20), got(20);
  ref::matmul(ref_w, x.data(), 1, want.data());
  IsaScope scope(Isa::scalar);
  matmul(opt_w, x.data(), 1, got.data(), test_pool());
  for (size_t r = 0; r < 20; ++r) EXPECT_NEAR(got[r], want[r], 1e-5f) << r;
}

// --- attention ----------------------------------------------------------------

struct AttnCase {
  size_t n_heads, n_kv_heads, head_dim, n, start, window;
  float softcap;
  KvDtype kv = KvDtype::fp32;
  // Fill the cache positions no row may see (before the first row's window,
  // past the last key) with NaN: a kernel that reads them into a sum fails.
  bool poison = false;
  bool sinks = false;  // gpt-oss's attention sinks, random per head in [-2, 5]
};

// Per-head sink logits when the case asks for them (AttentionArgs::sinks), else empty.
std::vector<float> attention_sinks(const AttnCase& c, std::mt19937& rng) {
  if (!c.sinks) return {};
  std::uniform_real_distribution<float> u(-2.0f, 5.0f);
  std::vector<float> s(c.n_heads);
  for (float& x : s) x = u(rng);
  return s;
}

std::string describe(const AttnCase& c) {
  return std::string(kv_dtype_name(c.kv)) + " cache heads=" + std::to_string(c.n_heads) + "/" +
         std::to_string(c.n_kv_heads) + " hd=" + std::to_string(c.head_dim) +
         " n=" + std::to_string(c.n) + " start=" + std::to_string(c.start) +
         " window=" + std::to_string(c.window) + " softcap=" + std::to_string(c.softcap) +
         (c.sinks ? " sinks" : "");
}

class KernelAttention : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelAttention, ::testing::ValuesIn(tiers_of("attention")),
                         tier_name);

// A bf16 KV cache: values rounded to nearest even (as the forward pass writes
// them), starting one element past the allocation (odd addresses).
class Bf16Cache {
 public:
  explicit Bf16Cache(const OddBuffer& x) : buf_(x.size() + 1) {
    for (size_t i = 0; i < x.size(); ++i) buf_[i + 1] = float_to_bf16(x[i]);
  }
  const uint16_t* data() const { return buf_.data() + 1; }
  // The same values widened to fp32: what every path must compute with.
  OddBuffer widened() const {
    OddBuffer w(buf_.size() - 1);
    for (size_t i = 0; i + 1 < buf_.size(); ++i) w[i] = bf16_to_float(buf_[i + 1]);
    return w;
  }

 private:
  std::vector<uint16_t> buf_;
};

// A q8_0 KV cache quantized as the forward pass writes it (quantize_kv_q8_0),
// int8 and scales each one element past their allocation (odd addresses).
class Q8Cache {
 public:
  explicit Q8Cache(const OddBuffer& x) : q_(x.size() + 1), s_(x.size() / kKvQ8Block + 1) {
    quantize_kv_q8_0(x.data(), x.size(), q_.data() + 1, s_.data() + 1);
  }
  const int8_t* data() const { return q_.data() + 1; }
  const uint16_t* scales() const { return s_.data() + 1; }
  // The dequantized values, int8 times the half scale (exact in fp32).
  OddBuffer widened() const {
    OddBuffer w(q_.size() - 1);
    for (size_t i = 0; i + 1 < q_.size(); ++i)
      w[i] = static_cast<float>(q_[i + 1]) * f16_to_float(s_[1 + i / kKvQ8Block]);
    return w;
  }

 private:
  std::vector<int8_t> q_;
  std::vector<uint16_t> s_;
};

// Scales each 32-value block of x by 2^e, e uniform in [lo, hi): q8_0 blocks
// of a real cache differ in magnitude, so a block read with another block's
// (or V's with K's) scale is far off, and the per-row tolerance below sees
// magnitudes that are not all ~1.
void vary_block_magnitudes(OddBuffer& x, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> e(lo, hi);
  for (size_t b = 0; b < x.size(); b += kKvQ8Block) {
    const float f = std::exp2(e(rng));
    for (size_t i = b; i < std::min(x.size(), b + kKvQ8Block); ++i) x[i] *= f;
  }
}

// The first way a tier's output differs from what it must give ("" if none).
struct AttnMismatch {
  std::string vs_reference;  // beyond the fp32 tolerance of the reference on the same cache
  std::string vs_widened;    // bf16/q8_0: not the bits of the tier on the widened fp32 cache
  bool ok() const { return vs_reference.empty() && vs_widened.empty(); }
};

// Tolerance of output row (t, h): the tier and the reference read the same
// (exactly widened) cache and differ only in fp32 rounding order. A score
// s_p = scale * q . k_p summed in another order moves by a few 2^-24 * A,
// A = scale * max_p sum_d |q_d k_pd| (rounding errors random-walk, and A
// already sums the magnitudes; hd * 2^-24 * A is the never-reached worst
// case); moving scores by delta moves the softmax-weighted mean of the values
// by at most 2 delta Vmax (Vmax = max |v| over the row's keys). exp's ~2 ulp,
// the P.V sums (weights sum to 1: partial sums <= Vmax) and the final 1 / l
// add a few 2^-24 Vmax. So 4 * 2^-24 * Vmax * (2 A + 8): it grows with neither
// the number of keys nor head_dim beyond A. The Sweep, LongContexts and
// DecodeSplitsKeys cases reach at most ~0.15 of it (fp32, bf16 and q8_0
// caches alike); a q8_0 block read with the wrong scale is thousands of times over.
std::vector<double> attention_tolerances(const AttentionArgs& a, const float* k, const float* v) {
  const size_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  std::vector<double> tol(a.n * a.n_heads);
  for (size_t t = 0; t < a.n; ++t) {
    const size_t pos = a.start + t, first = a.window && pos + 1 > a.window ? pos + 1 - a.window : 0;
    for (size_t h = 0; h < a.n_heads; ++h) {
      const float* q = a.q + (t * a.n_heads + h) * hd;
      const size_t kvh = h / group;
      double amax = 0.0, vmax = 0.0;
      for (size_t p = first; p <= pos; ++p) {
        const float* kp = k + (kvh * a.cache_stride + p) * hd;
        const float* vp = v + (kvh * a.cache_stride + p) * hd;
        double sum = 0.0;
        for (size_t d = 0; d < hd; ++d) {
          sum += std::fabs(double{q[d]} * kp[d]);
          vmax = std::max(vmax, std::fabs(double{vp[d]}));
        }
        amax = std::max(amax, sum * a.scale);
      }
      tol[t * a.n_heads + h] = 4.0 * std::ldexp(1.0, -24) * vmax * (2.0 * amax + 8.0);
    }
  }
  return tol;
}

AttnMismatch attention_mismatch(Isa isa, const AttnCase& c, std::mt19937& rng, ThreadPool& pool) {
  const size_t keys = c.start + c.n;
  const size_t stride = keys + 3;  // the cache is longer than what is filled
  const OddBuffer q = random_buffer(c.n * c.n_heads * c.head_dim, rng, -2.0f, 2.0f);
  OddBuffer k = random_buffer(c.n_kv_heads * stride * c.head_dim, rng, -2.0f, 2.0f);
  OddBuffer v = random_buffer(c.n_kv_heads * stride * c.head_dim, rng);
  const bool bf16 = c.kv == KvDtype::bf16, q8 = c.kv == KvDtype::q8_0;
  if (q8) {
    vary_block_magnitudes(k, rng, -3.0f, 1.0f);
    vary_block_magnitudes(v, rng, -4.0f, 2.0f);
  }
  if (c.poison) {
    const size_t first = c.window > 0 && c.start + 1 > c.window ? c.start + 1 - c.window : 0;
    for (size_t h = 0; h < c.n_kv_heads; ++h) {
      for (size_t p = 0; p < stride; ++p) {
        if (p >= first && p < keys) continue;
        for (size_t d = 0; d < c.head_dim; ++d)
          k[(h * stride + p) * c.head_dim + d] = v[(h * stride + p) * c.head_dim + d] =
              std::nanf("");
      }
    }
  }
  std::optional<Bf16Cache> k16, v16;
  std::optional<Q8Cache> k8, v8;
  AttentionArgs a;
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  if (bf16) {
    k16.emplace(k);
    v16.emplace(v);
    a.k_cache = k16->data();
    a.v_cache = v16->data();
  } else if (q8) {
    k8.emplace(k);
    v8.emplace(v);
    a.k_cache = k8->data();
    a.v_cache = v8->data();
    a.k_scale = k8->scales();
    a.v_scale = v8->scales();
  }
  a.kv_dtype = c.kv;
  a.n = c.n;
  a.start = c.start;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.cache_stride = stride;
  a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.softcap = c.softcap;
  const std::vector<float> sinks = attention_sinks(c, rng);
  a.sinks = c.sinks ? sinks.data() : nullptr;
  // The values every path must compute with.
  const OddBuffer kw = bf16 ? k16->widened() : q8 ? k8->widened() : k;
  const OddBuffer vw = bf16 ? v16->widened() : q8 ? v8->widened() : v;

  std::vector<float> want(c.n * c.n_heads * c.head_dim);
  a.out = want.data();
  ref::attention(a);
  OddBuffer got(want.size(), std::nanf(""));
  a.out = got.data();
  IsaScope scope(isa);
  attention(a, pool);
  AttnMismatch r;
  const std::string where = std::string(isa_name(isa)) + " " + describe(c) + " at ";
  if (!got.guard_intact()) r.vs_reference = where + "the guards: store past the end";
  const std::vector<double> tol = attention_tolerances(a, kw.data(), vw.data());
  for (size_t i = 0; i < want.size() && r.vs_reference.empty(); ++i) {
    if (!(std::fabs(want[i] - got[i]) <= tol[i / c.head_dim]))
      r.vs_reference = where + std::to_string(i) + ": got " + std::to_string(got[i]) + " want " +
                       std::to_string(want[i]) + " (tolerance " +
                       std::to_string(tol[i / c.head_dim]) + ")";
  }
  if (!bf16 && !q8) return r;
  // Widening is exact, so the tier on the bf16 / q8_0 cache must give the very
  // bits it gives on an fp32 cache holding the widened values.
  AttentionArgs w = a;
  w.k_cache = kw.data();
  w.v_cache = vw.data();
  w.kv_dtype = KvDtype::fp32;
  w.k_scale = w.v_scale = nullptr;
  OddBuffer same(want.size(), std::nanf(""));
  w.out = same.data();
  attention(w, pool);
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &same[i], sizeof(float)) != 0) {
      r.vs_widened = where + std::to_string(i) + ": " + std::string(kv_dtype_name(c.kv)) +
                     " cache gave " + std::to_string(got[i]) + ", its fp32 widening " +
                     std::to_string(same[i]);
      break;
    }
  }
  return r;
}

bool check_attention(Isa isa, const AttnCase& c, std::mt19937& rng, ThreadPool& pool) {
  const AttnMismatch m = attention_mismatch(isa, c, rng, pool);
  if (!m.vs_reference.empty()) ADD_FAILURE() << m.vs_reference;
  if (!m.vs_widened.empty()) ADD_FAILURE() << m.vs_widened;
  return m.ok();
}

// The cache dtypes a head_dim supports (q8_0 quantizes blocks of 32).
std::vector<KvDtype> kv_dtypes(size_t head_dim) {
  if (head_dim % kKvQ8Block == 0) return {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0};
  return {KvDtype::fp32, KvDtype::bf16};
}

TEST_P(KernelAttention, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(7);
  const size_t heads[][2] = {{9, 3}, {4, 1}, {2, 2}, {8, 2}};
  size_t count = 0;
  for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
    for (const auto& h : heads) {
      for (size_t hd : {8, 24, 64, 80, 128, 256}) {
        if (kv == KvDtype::q8_0 && hd % kKvQ8Block != 0) continue;
        for (size_t n : {1, 2, 3, 5, 8, 9, 17, 33, 40}) {
          for (size_t start : {0, 1, 7, 130}) {
            for (size_t window : {0, 4, 100}) {
              if (!testing::sampled_case(count)) continue;
              const float softcap = (n + start) % 2 ? 0.0f : 1.5f;
              ASSERT_TRUE(check_attention(isa, {h[0], h[1], hd, n, start, window, softcap, kv}, rng,
                                          test_pool()));
            }
          }
        }
      }
    }
  }
}

// Decode over a long cache splits the keys across threads (flash-decoding);
// long prefills have many query tiles.
TEST_P(KernelAttention, LongContexts) {
  const Isa isa = GetParam();
  std::mt19937 rng(8);
  ThreadPool pool2(2);
  const AttnCase cases[] = {
      {9, 3, 64, 1, 1000, 0, 0.0f},
      {4, 1, 256, 1, 2047, 0, 0.0f},
      {4, 1, 256, 1, 2047, 512, 0.0f},
      {32, 8, 64, 1, 777, 0, 30.0f},
      {9, 3, 64, 70, 0, 0, 0.0f},
      {4, 1, 256, 100, 300, 64, 0.0f},
      {8, 2, 64, 3, 600, 0, 0.0f},
      // Wide groups: amx rows of 6 tokens x 5 heads, of 1 token x 32 heads; 64 per kv
      // head is past amx's limit (avx512 takes it).
      {10, 2, 64, 50, 20, 0, 0.0f},
      {32, 1, 64, 20, 40, 16, 0.0f},
      {64, 1, 64, 17, 5, 0, 0.0f},
  };
  for (AttnCase c : cases) {
    for (KvDtype kv : kv_dtypes(c.head_dim)) {
      c.kv = kv;
      EXPECT_TRUE(check_attention(isa, c, rng, pool2));
      EXPECT_TRUE(check_attention(isa, c, rng, test_pool()));
    }
  }
}

// Decode shapes (n < 16, the avx512 decode kernel's range): long caches whose
// keys split across 2 and 3 threads, odd head counts, groups of 1 to 10 heads
// (the kernel shares V loads across 4 rows at a time), head_dim not a multiple
// of 64, windows, softcap, every cache dtype, and NaN in every cache position
// outside the rows' keys (a q8_0 block holding NaN has a NaN scale).
TEST_P(KernelAttention, DecodeSplitsKeys) {
  const Isa isa = GetParam();
  std::mt19937 rng(11);
  ThreadPool pool2(2), pool3(3);
  // {n_heads, n_kv_heads, head_dim}
  const size_t shapes[][3] = {{15, 5, 16}, {7, 7, 80}, {5, 1, 48}, {12, 2, 256},
                              {10, 1, 64}, {9, 3, 96}, {6, 6, 32}};
  size_t i = 0, count = 0;
  for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
    for (const auto& h : shapes) {
      if (kv == KvDtype::q8_0 && h[2] % kKvQ8Block != 0) continue;
      for (size_t n : {1, 3, 15}) {
        for (size_t start : {129, 1000, 2333}) {
          for (size_t window : {0, 1500}) {
            if (!testing::sampled_case(count)) continue;
            const float softcap = (n + start) % 2 ? 0.0f : 20.0f;
            const AttnCase c{h[0], h[1], h[2], n, start, window, softcap, kv, true};
            ThreadPool& pool = ++i % 2 ? pool2 : pool3;
            ASSERT_TRUE(check_attention(isa, c, rng, pool)) << pool.size() << " threads";
          }
        }
      }
    }
  }
}

// The q8_0 fault hooks of the decode kernels (avx512 decode, avx2): with a
// block read through its neighbour's scale, or V through K's scales, the
// tolerance check against the reference fails (and the bits differ from the
// tier on the widened cache); with no fault both pass. Decode shapes of
// SmolLM2 and Gemma 3, keys split across threads.
TEST_P(KernelAttention, Q8FaultsAreCaught) {
  const Isa isa = GetParam();
  ThreadPool pool2(2);
  const AttnCase cases[] = {{9, 3, 64, 1, 1000, 0, 0.0f, KvDtype::q8_0},
                            {4, 1, 256, 1, 700, 512, 0.0f, KvDtype::q8_0},
                            {8, 2, 64, 3, 300, 0, 20.0f, KvDtype::q8_0}};
  for (const AttnCase& c : cases) {
    std::mt19937 rng(12);
    const AttnMismatch clean = attention_mismatch(isa, c, rng, pool2);
    EXPECT_TRUE(clean.ok()) << clean.vs_reference << clean.vs_widened;
    for (fault::Fault f : {fault::Fault::kv_scale_wrong_block, fault::Fault::v_through_k_scale}) {
      fault::Scoped on(f);
      std::mt19937 same_rng(12);
      const AttnMismatch m = attention_mismatch(isa, c, same_rng, pool2);
      EXPECT_FALSE(m.vs_reference.empty()) << fault::name(f) << " passed " << describe(c);
      EXPECT_FALSE(m.vs_widened.empty()) << fault::name(f) << " kept the bits " << describe(c);
    }
  }
}

// gpt-oss's attention sinks on every path: decode (n < 16, keys split across 2 and 3 threads on
// long caches), prefill (n >= 16), windows, GQA groups, every cache dtype; the sinks in
// [-2, 5] are as large as the rows' scores or larger, so a dropped or misplaced sink (another
// head's, or added where a split is combined twice) is far outside the tolerance.
TEST_P(KernelAttention, Sinks) {
  const Isa isa = GetParam();
  std::mt19937 rng(31);
  ThreadPool pool2(2), pool3(3);
  const size_t heads[][2] = {{9, 3}, {4, 1}, {8, 8}};
  size_t i = 0, count = 0;
  for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0})
    for (const auto& h : heads)
      for (size_t hd : {64, 24})
        for (size_t n : {1, 3, 17, 40})
          for (size_t start : {0, 7, 1500})
            for (size_t window : {0, 100}) {
              if (kv == KvDtype::q8_0 && hd % kKvQ8Block != 0) continue;
              if (!testing::sampled_case(count)) continue;
              const AttnCase c{h[0], h[1], hd, n, start, window, 0.0f, kv, false, true};
              ThreadPool& pool = ++i % 2 ? pool2 : pool3;
              ASSERT_TRUE(check_attention(isa, c, rng, pool)) << pool.size() << " threads";
            }
}

// head_dim not a multiple of 8 takes the scalar fallback.
TEST_P(KernelAttention, OddHeadDim) {
  const Isa isa = GetParam();
  std::mt19937 rng(9);
  for (size_t hd : {2, 6, 12, 66})
    for (KvDtype kv : kv_dtypes(hd))
      EXPECT_TRUE(check_attention(isa, {4, 2, hd, 5, 3, 0, 0.0f, kv}, rng, test_pool()));
}

// Every tier stays at the error of fp32 arithmetic, measured against the same
// attention in float64: the amx tier's bf16 parts must add up to fp32 operands
// (a dropped part pass is 3-9e-6 off here; the fp32 tiers and the full amx
// split 0.3-1.3e-6), a bound the Sweep's 1e-5 is too loose to hold.
TEST_P(KernelAttention, Fp32ClassError) {
  const Isa isa = GetParam();
  std::mt19937 rng(11);
  const AttnCase cases[] = {
      {9, 3, 64, 70, 0, 0, 0.0f}, {4, 1, 256, 100, 300, 64, 0.0f}, {8, 2, 128, 40, 130, 0, 0.0f}};
  for (const AttnCase& c : cases) {
    const size_t keys = c.start + c.n, hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
    const OddBuffer q = random_buffer(c.n * c.n_heads * hd, rng, -2.0f, 2.0f);
    const OddBuffer k = random_buffer(c.n_kv_heads * keys * hd, rng, -2.0f, 2.0f);
    const OddBuffer v = random_buffer(c.n_kv_heads * keys * hd, rng);
    AttentionArgs a;
    a.q = q.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.n = c.n;
    a.start = c.start;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = hd;
    a.cache_stride = keys;
    a.window = c.window;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    OddBuffer got(c.n * c.n_heads * hd);
    a.out = got.data();
    {
      IsaScope scope(isa);
      attention(a, test_pool());
    }
    double worst = 0.0;
    for (size_t t = 0; t < c.n; ++t) {
      const size_t pos = c.start + t,
                   first = c.window && pos + 1 > c.window ? pos + 1 - c.window : 0;
      for (size_t h = 0; h < c.n_heads; ++h) {
        const float* qr = q.data() + (t * c.n_heads + h) * hd;
        const size_t kvh = h / group;
        std::vector<double> w(pos + 1 - first);
        double max_s = -INFINITY, sum = 0.0;
        for (size_t p = first; p <= pos; ++p) {
          double s = 0.0;
          for (size_t d = 0; d < hd; ++d) s += double{qr[d]} * k[(kvh * keys + p) * hd + d];
          w[p - first] = s * a.scale;
          max_s = std::max(max_s, w[p - first]);
        }
        for (double& e : w) sum += (e = std::exp(e - max_s));
        for (size_t d = 0; d < hd; ++d) {
          double o = 0.0;
          for (size_t p = first; p <= pos; ++p) o += w[p - first] * v[(kvh * keys + p) * hd + d];
          worst = std::max(worst, std::fabs(o / sum - got[(t * c.n_heads + h) * hd + d]));
        }
      }
    }
    EXPECT_LT(worst, 2e-6) << isa_name(isa) << " " << describe(c);
  }
}

// A sink joins the softmax denominator with a zero value: one key k with score s = scale q.k
// gives out = v e^s / (e^s + e^sink), whichever of the two is larger.
TEST(KernelAttentionReference, SinkJoinsTheDenominator) {
  const float q[4] = {0.5f, -1.0f, 2.0f, 0.25f}, k[4] = {1.0f, 0.5f, -0.75f, 2.0f};
  const float v[4] = {1.0f, -2.0f, 3.0f, 0.5f};
  for (float sink : {-3.0f, 0.0f, 0.4f, 6.0f}) {
    AttentionArgs a;
    a.q = q;
    a.k_cache = k;
    a.v_cache = v;
    a.n = 1;
    a.n_heads = a.n_kv_heads = 1;
    a.head_dim = 4;
    a.cache_stride = 1;
    a.scale = 0.5f;
    a.sinks = &sink;
    float out[4];
    a.out = out;
    ref::attention(a);
    double s = 0.0;
    for (int d = 0; d < 4; ++d) s += double{q[d]} * k[d];
    s *= 0.5;
    const double w = 1.0 / (1.0 + std::exp(double{sink} - s));
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(out[d], v[d] * w, 1e-6) << "sink " << sink;
  }
}

// The profiler's attention flops count the keys each query sees.
TEST(KernelAttentionFlops, CausalAndWindowed) {
  AttentionArgs a;
  a.n_heads = 3;
  a.head_dim = 8;
  a.n = 3;
  a.start = 2;  // queries at positions 2, 3, 4 see 3, 4, 5 keys
  EXPECT_DOUBLE_EQ(attention_flops(a), 4.0 * (3 + 4 + 5) * 3 * 8);
  a.window = 4;  // ... and at most 4 of them
  EXPECT_DOUBLE_EQ(attention_flops(a), 4.0 * (3 + 4 + 4) * 3 * 8);
  a.start = 0;
  a.window = 0;
  a.n = 100;  // a prompt from 0: n (n + 1) / 2 query-key pairs, about half the square
  EXPECT_DOUBLE_EQ(attention_flops(a), 4.0 * 5050 * 3 * 8);
}

// The reference's widening: on a bf16 cache it computes exactly what it
// computes on the fp32 cache holding the widened values, and those differ
// from the unrounded cache (so the bf16 tests above see real rounding).
TEST(KernelAttentionReference, Bf16CacheWidensExactly) {
  std::mt19937 rng(10);
  const size_t heads = 4, kv_heads = 2, hd = 24, n = 3, start = 9, stride = 14;
  const OddBuffer q = random_buffer(n * heads * hd, rng, -2.0f, 2.0f);
  const OddBuffer k = random_buffer(kv_heads * stride * hd, rng, -2.0f, 2.0f);
  const OddBuffer v = random_buffer(kv_heads * stride * hd, rng);
  const Bf16Cache k16(k), v16(v);
  const OddBuffer kw = k16.widened(), vw = v16.widened();
  AttentionArgs a;
  a.q = q.data();
  a.n = n;
  a.start = start;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = hd;
  a.cache_stride = stride;
  a.scale = 0.2f;
  std::vector<float> on_bf16(n * heads * hd), on_widened(on_bf16.size()), on_fp32(on_bf16.size());
  a.k_cache = k16.data();
  a.v_cache = v16.data();
  a.kv_dtype = KvDtype::bf16;
  a.out = on_bf16.data();
  ref::attention(a);
  a.k_cache = kw.data();
  a.v_cache = vw.data();
  a.kv_dtype = KvDtype::fp32;
  a.out = on_widened.data();
  ref::attention(a);
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.out = on_fp32.data();
  ref::attention(a);
  EXPECT_EQ(0, std::memcmp(on_bf16.data(), on_widened.data(), on_bf16.size() * sizeof(float)));
  double diff = 0;
  for (size_t i = 0; i < on_bf16.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::fabs(on_bf16[i] - on_fp32[i])));
  EXPECT_GT(diff, 1e-5) << "bf16 rounding should move the output";
  EXPECT_LT(diff, 2e-2) << "but only by bf16's 2^-9 relative error";
}

// --- attention at AttnPrecision::bf16 ---------------------------------------------

// The tiers with a bf16 attention path (avx512's vdpbf16ps kernel, amx's one-part
// tiles); the others compute fp32 at either precision.
std::vector<Isa> bf16_attention_tiers() {
  std::vector<Isa> tiers;
  for (Isa isa : tiers_of("attention"))
    if (isa >= Isa::avx512) tiers.push_back(isa);
  return tiers;
}

class KernelAttentionBf16 : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelAttentionBf16, ::testing::ValuesIn(bf16_attention_tiers()),
                         tier_name);

// One case's inputs: q, K, V random (q, K in [-2, 2], V in [-1, 1]), the cache
// longer than what is filled; the K/V cache fp32 or bf16 (rounded as written).
struct AttnInputs {
  OddBuffer q, k, v;
  std::optional<Bf16Cache> k16, v16;
  std::optional<Q8Cache> k8, v8;
  AttentionArgs args;
  std::vector<float> sinks;
};

AttnInputs attention_inputs(const AttnCase& c, std::mt19937& rng) {
  const size_t stride = c.start + c.n + 3;
  AttnInputs in{random_buffer(c.n * c.n_heads * c.head_dim, rng, -2.0f, 2.0f),
                random_buffer(c.n_kv_heads * stride * c.head_dim, rng, -2.0f, 2.0f),
                random_buffer(c.n_kv_heads * stride * c.head_dim, rng),
                std::nullopt,
                std::nullopt,
                std::nullopt,
                std::nullopt,
                {}};
  AttentionArgs& a = in.args;
  a.q = in.q.data();
  a.k_cache = in.k.data();
  a.v_cache = in.v.data();
  if (c.kv == KvDtype::bf16) {
    in.k16.emplace(in.k);
    in.v16.emplace(in.v);
    a.k_cache = in.k16->data();
    a.v_cache = in.v16->data();
  } else if (c.kv == KvDtype::q8_0) {
    in.k8.emplace(in.k);
    in.v8.emplace(in.v);
    a.k_cache = in.k8->data();
    a.v_cache = in.v8->data();
    a.k_scale = in.k8->scales();
    a.v_scale = in.v8->scales();
  }
  a.kv_dtype = c.kv;
  a.n = c.n;
  a.start = c.start;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.cache_stride = stride;
  a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.softcap = c.softcap;
  a.precision = AttnPrecision::bf16;
  in.sinks = attention_sinks(c, rng);
  a.sinks = c.sinks ? in.sinks.data() : nullptr;
  return in;
}

// The kernel's distance to ref::attention_bf16 relative to the reference's own
// bound (ratio <= 1 passes), and the first output past it.
struct Bf16Check {
  bool ok = true;
  double worst_ratio = 0.0;   // max |got - want| / tol
  double median_ratio = 0.0;  // over the outputs
  std::string failure;
};

Bf16Check check_attention_bf16(Isa isa, const AttnCase& c, std::mt19937& rng, ThreadPool& pool) {
  AttnInputs in = attention_inputs(c, rng);
  AttentionArgs& a = in.args;
  const size_t size = c.n * c.n_heads * c.head_dim;
  std::vector<float> want(size), tol(size);
  // A q8_0 cache's values are its exact widening: the reference (and the bit
  // check below) run on the fp32 cache holding them.
  std::optional<OddBuffer> k8w, v8w;
  AttentionArgs ref_args = a;
  if (c.kv == KvDtype::q8_0) {
    k8w.emplace(in.k8->widened());
    v8w.emplace(in.v8->widened());
    ref_args.k_cache = k8w->data();
    ref_args.v_cache = v8w->data();
    ref_args.kv_dtype = KvDtype::fp32;
    ref_args.k_scale = ref_args.v_scale = nullptr;
  }
  ref_args.out = want.data();
  ref::attention_bf16(ref_args, tol.data());
  OddBuffer got(size, std::nanf(""));
  a.out = got.data();
  {
    IsaScope scope(isa);
    attention(a, pool);
  }
  Bf16Check r;
  if (!got.guard_intact()) {
    r.ok = false;
    r.failure = "store past the end";
    return r;
  }
  std::vector<double> ratios(size);
  for (size_t i = 0; i < size; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = ratios[i] = err / tol[i];
    if (!(ratio <= 1.0)) {  // NaN fails too
      r.ok = false;
      r.worst_ratio = std::isnan(ratio) ? INFINITY : std::max(r.worst_ratio, ratio);
      if (r.failure.empty())
        r.failure = std::string(isa_name(isa)) + " " + describe(c) + " at " + std::to_string(i) +
                    ": got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
                    " tol " + std::to_string(tol[i]);
      continue;
    }
    r.worst_ratio = std::max(r.worst_ratio, ratio);
  }
  std::nth_element(ratios.begin(), ratios.begin() + size / 2, ratios.end());
  r.median_ratio = ratios[size / 2];
  if (!r.ok || c.kv == KvDtype::fp32) return r;
  // A bf16 or q8_0 cache widens exactly: the kernel must give the very bits it
  // gives on an fp32 cache holding the widened values.
  const OddBuffer kw = c.kv == KvDtype::bf16 ? in.k16->widened() : in.k8->widened();
  const OddBuffer vw = c.kv == KvDtype::bf16 ? in.v16->widened() : in.v8->widened();
  AttentionArgs w = a;
  w.k_cache = kw.data();
  w.v_cache = vw.data();
  w.kv_dtype = KvDtype::fp32;
  w.k_scale = w.v_scale = nullptr;
  OddBuffer same(size, std::nanf(""));
  w.out = same.data();
  {
    IsaScope scope(isa);
    attention(w, pool);
  }
  for (size_t i = 0; i < size; ++i) {
    if (std::memcmp(&got[i], &same[i], sizeof(float)) != 0) {
      r.ok = false;
      r.failure = std::string(isa_name(isa)) + " " + describe(c) + " at " + std::to_string(i) +
                  ": bf16 cache gave " + std::to_string(got[i]) + ", its fp32 widening " +
                  std::to_string(same[i]);
      break;
    }
  }
  return r;
}

// Odd shapes against the rounding-aware reference: n not a multiple of the
// 48-row item or the 32-key block, start > 0 (continued prefill), windows
// that cut a block, softcap, groups of 1, 3, 4, 5, 8, head_dim 32 to 256,
// both cache dtypes.
TEST_P(KernelAttentionBf16, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(21);
  const size_t heads[][2] = {{2, 2}, {9, 3}, {4, 1}, {8, 1}, {10, 2}};
  double worst = 0.0, median = 0.0;
  size_t i = 0, count = 0;
  for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
    for (const auto& h : heads) {
      for (size_t hd : {32, 64, 96, 256}) {
        for (size_t n : {16, 17, 49, 70}) {
          for (size_t start : {0, 1, 45}) {
            for (size_t window : {0, 5, 40}) {
              // A third of the combinations: every value of each axis still meets the others.
              if (++i % 3 != 0 || !testing::sampled_case(count)) continue;
              const float softcap = (n + start + window) % 2 ? 0.0f : 1.5f;
              const Bf16Check r = check_attention_bf16(
                  isa, {h[0], h[1], hd, n, start, window, softcap, kv}, rng, test_pool());
              ASSERT_TRUE(r.ok) << r.failure;
              worst = std::max(worst, r.worst_ratio);
              median = std::max(median, r.median_ratio);
            }
          }
        }
      }
    }
  }
  std::printf(
      "bf16 attention sweep on %s: |kernel - reference| at most %.3g of the bound, a case's "
      "median at most %.3g\n",
      std::string(isa_name(isa)).c_str(), worst, median);
}

// Model shapes at longer contexts: many key blocks, rescales, query items on
// two threads; Gemma 3's local layers (window 512) and a softcapped shape.
TEST_P(KernelAttentionBf16, ModelShapes) {
  const Isa isa = GetParam();
  std::mt19937 rng(22);
  ThreadPool pool2(2);
  const AttnCase cases[] = {
      {9, 3, 64, 300, 0, 0, 0.0f},      {9, 3, 64, 100, 411, 0, 0.0f}, {4, 1, 256, 200, 0, 0, 0.0f},
      {4, 1, 256, 130, 600, 512, 0.0f}, {8, 2, 64, 77, 300, 0, 30.0f}, {32, 8, 64, 40, 20, 0, 0.0f},
      {48, 1, 64, 20, 33, 0, 0.0f},  // a whole item per token
  };
  double worst = 0.0;
  for (AttnCase c : cases) {
    for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
      c.kv = kv;
      const Bf16Check r = check_attention_bf16(isa, c, rng, pool2);
      EXPECT_TRUE(r.ok) << r.failure;
      worst = std::max(worst, r.worst_ratio);
    }
  }
  std::printf("bf16 attention model shapes on %s: worst %.3g of the bound\n",
              std::string(isa_name(isa)).c_str(), worst);
}

// gpt-oss's sinks on the bf16 prefill paths (log2-unit softmax): groups that split a
// 16-row vector, windows, a start inside a key block, every cache dtype.
TEST_P(KernelAttentionBf16, Sinks) {
  const Isa isa = GetParam();
  std::mt19937 rng(23);
  ThreadPool pool2(2);
  const AttnCase cases[] = {{9, 3, 64, 40, 0, 0, 0.0f},
                            {4, 1, 64, 17, 45, 5, 0.0f},
                            {8, 8, 32, 70, 1, 40, 0.0f},
                            {64, 8, 64, 20, 130, 16, 0.0f},
                            {10, 2, 96, 49, 0, 0, 0.0f}};
  for (AttnCase c : cases) {
    c.sinks = true;
    for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
      c.kv = kv;
      const Bf16Check r = check_attention_bf16(isa, c, rng, pool2);
      EXPECT_TRUE(r.ok) << r.failure;
    }
  }
}

// The check's power, shown on the kernel itself: a skipped key block at the
// causal diagonal, and bf16 truncation instead of nearest even (of q, an fp32
// cache's K and V, and P), each fail it.
TEST_P(KernelAttentionBf16, FaultsAreCaught) {
  const Isa isa = GetParam();
  const AttnCase cases[] = {
      {9, 3, 64, 70, 0, 0, 0.0f}, {4, 1, 256, 40, 100, 64, 0.0f}, {9, 3, 64, 300, 0, 0, 0.0f}};
  for (const AttnCase& c : cases) {
    for (fault::Fault f : {fault::Fault::skip_attention_block, fault::Fault::bf16_truncate}) {
      std::mt19937 rng(23);
      EXPECT_TRUE(check_attention_bf16(isa, c, rng, test_pool()).ok) << describe(c);
      rng.seed(23);
      fault::Scoped scoped(f);
      const Bf16Check r = check_attention_bf16(isa, c, rng, test_pool());
      EXPECT_FALSE(r.ok) << fault::name(f) << " went unnoticed: " << describe(c);
      std::printf("%s, %s: %.3g x the bound\n", std::string(fault::name(f)).c_str(),
                  describe(c).c_str(), r.worst_ratio);
    }
  }
}

// The AMX prefill attention on the tile model against the same kernel on the
// silicon, bit for bit: both precisions, every cache dtype, GQA groups of 1 to
// 32 heads, a window, a softcap, a start inside a key block, odd token counts.
TEST(AmxTilesMatchSilicon, Attention) {
  if (detect_isa() != Isa::amx) GTEST_SKIP() << kNoAmxSilicon;
  std::mt19937 rng(47);
  const AttnCase cases[] = {{9, 3, 64, 40, 13, 0, 0.0f},  {4, 1, 256, 20, 0, 16, 0.0f},
                            {8, 2, 64, 33, 50, 0, 30.0f}, {32, 8, 64, 17, 0, 0, 0.0f},
                            {32, 1, 32, 16, 3, 0, 0.0f},  {2, 2, 96, 70, 31, 0, 0.0f}};
  for (AttnCase c : cases) {
    for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16, KvDtype::q8_0}) {
      c.kv = kv;
      for (AttnPrecision p : {AttnPrecision::fp32, AttnPrecision::bf16}) {
        AttnInputs in = attention_inputs(c, rng);
        in.args.precision = p;
        const size_t size = c.n * c.n_heads * c.head_dim;
        std::vector<float> silicon(size), model(size);
        {
          TileBackendScope on(TileBackend::silicon);
          in.args.out = silicon.data();
          amx::attention_prefill(in.args, test_pool());
        }
        {
          TileBackendScope on(TileBackend::model);
          in.args.out = model.data();
          amx::attention_prefill(in.args, test_pool());
        }
        ASSERT_EQ(std::memcmp(silicon.data(), model.data(), size * sizeof(float)), 0)
            << attn_precision_name(p) << " " << describe(c);
      }
    }
  }
}

// Against attention on the unrounded inputs in float64: the bf16 roundings
// (q, K, V, P each by <= 2^-9 relative) move a score by at most
// 2^-8 scale sum|q k| = 2^-8 a, a weight by e^(2 * 2^-8 a_max) - 1 plus P's
// 2^-9, an output by that times sum w|v| plus V's 2^-9 |v| <= 2^-9; a
// sanity bound, far above the fp32 tiers' 2e-6 and far below what a wrong
// product or softmax gives.
TEST_P(KernelAttentionBf16, Float64SanityBound) {
  const Isa isa = GetParam();
  std::mt19937 rng(24);
  const AttnCase cases[] = {
      {9, 3, 64, 70, 0, 0, 0.0f}, {4, 1, 256, 100, 300, 64, 0.0f}, {8, 2, 128, 40, 130, 0, 0.0f}};
  for (const AttnCase& c : cases) {
    AttnInputs in = attention_inputs(c, rng);
    const AttentionArgs& a = in.args;
    const size_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads, stride = a.cache_stride;
    OddBuffer got(c.n * c.n_heads * hd);
    in.args.out = got.data();
    {
      IsaScope scope(isa);
      attention(in.args, test_pool());
    }
    double worst = 0.0, worst_bound = 0.0, sq = 0.0;
    size_t count = 0;
    for (size_t t = 0; t < c.n; ++t) {
      const size_t pos = c.start + t,
                   first = c.window && pos + 1 > c.window ? pos + 1 - c.window : 0;
      for (size_t h = 0; h < c.n_heads; ++h) {
        const float* qr = in.q.data() + (t * c.n_heads + h) * hd;
        const size_t kvh = h / group;
        std::vector<double> w(pos + 1 - first);
        double max_s = -INFINITY, sum = 0.0, a_max = 0.0;
        for (size_t p = first; p <= pos; ++p) {
          double s = 0.0, mag = 0.0;
          for (size_t d = 0; d < hd; ++d) {
            const double prod = double{qr[d]} * in.k[(kvh * stride + p) * hd + d];
            s += prod;
            mag += std::fabs(prod);
          }
          w[p - first] = s * a.scale;
          a_max = std::max(a_max, mag * a.scale);
          max_s = std::max(max_s, w[p - first]);
        }
        for (double& e : w) sum += (e = std::exp(e - max_s));
        const double bound = std::expm1(2 * 0x1p-8 * a_max) + 0x1p-9 + 0x1p-9;
        for (size_t d = 0; d < hd; ++d) {
          double o = 0.0;
          for (size_t p = first; p <= pos; ++p)
            o += w[p - first] * in.v[(kvh * stride + p) * hd + d];
          const double err = std::fabs(o / sum - got[(t * c.n_heads + h) * hd + d]);
          EXPECT_LE(err, bound) << describe(c) << " t=" << t << " h=" << h << " d=" << d;
          worst = std::max(worst, err);
          worst_bound = std::max(worst_bound, bound);
          sq += err * err;
          ++count;
        }
      }
    }
    std::printf("bf16 attention vs float64 on %s, %s: max %.3g (bound <= %.3g), rms %.3g\n",
                std::string(isa_name(isa)).c_str(), describe(c).c_str(), worst, worst_bound,
                std::sqrt(sq / count));
    // The roundings are really there: an fp32 kernel would sit near 1e-7.
    EXPECT_GT(worst, 1e-4) << describe(c);
  }
}

// Where bf16 has no path the dispatcher computes fp32 at that precision:
// decode (n < 16), head_dim % 32 != 0, groups past the item's rows; and
// every tier below avx512. The fp32 reference's 1e-5 then holds.
TEST(KernelAttentionBf16Fallback, ComputesFp32) {
  std::mt19937 rng(25);
  const AttnCase cases[] = {{9, 3, 64, 5, 100, 0, 0.0f},
                            {4, 2, 48, 40, 7, 0, 0.0f},
                            {4, 1, 80, 17, 0, 6, 1.5f},
                            {64, 1, 64, 17, 5, 0, 0.0f}};
  for (Isa isa : tiers_of("attention")) {
    if (isa > runnable_isa()) continue;
    for (AttnCase c : cases) {
      for (KvDtype kv : {KvDtype::fp32, KvDtype::bf16}) {
        c.kv = kv;
        AttnInputs in = attention_inputs(c, rng);
        const size_t size = c.n * c.n_heads * c.head_dim;
        std::vector<float> want(size);
        AttentionArgs fp32 = in.args;
        fp32.precision = AttnPrecision::fp32;
        fp32.out = want.data();
        ref::attention(fp32);
        OddBuffer got(size, std::nanf(""));
        in.args.out = got.data();
        {
          IsaScope scope(isa);
          attention(in.args, test_pool());
        }
        for (size_t i = 0; i < size; ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5) << isa_name(isa) << " " << describe(c) << " at " << i;
      }
    }
  }
}

// The reference's bound stays at fp32's class of error (rigorous, so a
// kernel's median distance is ~1e-3 of it; Sweep prints it): a median
// output's bound for SmolLM2's and Gemma 3's shapes at 300 keys is 3e-5 and
// 1e-4, where the bf16 roundings themselves move outputs by 4-6e-4 rms
// (Float64SanityBound).
TEST(KernelAttentionBf16Reference, BoundIsFp32Class) {
  std::mt19937 rng(26);
  for (const AttnCase& c :
       {AttnCase{9, 3, 64, 300, 0, 0, 0.0f}, AttnCase{4, 1, 256, 300, 0, 0, 0.0f}}) {
    AttnInputs in = attention_inputs(c, rng);
    const size_t size = c.n * c.n_heads * c.head_dim;
    std::vector<float> out(size), tol(size);
    in.args.out = out.data();
    ref::attention_bf16(in.args, tol.data());
    // ref::attention follows the precision.
    std::vector<float> via(size);
    in.args.out = via.data();
    ref::attention(in.args);
    EXPECT_EQ(0, std::memcmp(out.data(), via.data(), size * sizeof(float)));
    std::nth_element(tol.begin(), tol.begin() + size / 2, tol.end());
    std::printf("bf16 attention bound, %s: median %.3g\n", describe(c).c_str(), tol[size / 2]);
    EXPECT_LT(tol[size / 2], c.head_dim == 64 ? 4e-5 : 1.5e-4) << describe(c);
  }
}

// The reference on a q8_0 cache computes exactly what it computes on the fp32
// cache holding the dequantized values, and those differ from the unrounded
// cache (so the q8_0 tests above see real rounding).
TEST(KernelAttentionReference, Q8CacheDequantizesExactly) {
  std::mt19937 rng(13);
  const size_t heads = 4, kv_heads = 2, hd = 64, n = 3, start = 9, stride = 14;
  const OddBuffer q = random_buffer(n * heads * hd, rng, -2.0f, 2.0f);
  const OddBuffer k = random_buffer(kv_heads * stride * hd, rng, -2.0f, 2.0f);
  const OddBuffer v = random_buffer(kv_heads * stride * hd, rng);
  const Q8Cache k8(k), v8(v);
  const OddBuffer kw = k8.widened(), vw = v8.widened();
  AttentionArgs a;
  a.q = q.data();
  a.n = n;
  a.start = start;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = hd;
  a.cache_stride = stride;
  a.scale = 0.125f;
  std::vector<float> on_q8(n * heads * hd), on_widened(on_q8.size()), on_fp32(on_q8.size());
  a.k_cache = k8.data();
  a.v_cache = v8.data();
  a.k_scale = k8.scales();
  a.v_scale = v8.scales();
  a.kv_dtype = KvDtype::q8_0;
  a.out = on_q8.data();
  ref::attention(a);
  a.k_cache = kw.data();
  a.v_cache = vw.data();
  a.kv_dtype = KvDtype::fp32;
  a.out = on_widened.data();
  ref::attention(a);
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.out = on_fp32.data();
  ref::attention(a);
  EXPECT_EQ(0, std::memcmp(on_q8.data(), on_widened.data(), on_q8.size() * sizeof(float)));
  double diff = 0;
  for (size_t i = 0; i < on_q8.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::fabs(on_q8[i] - on_fp32[i])));
  EXPECT_GT(diff, 1e-5) << "q8_0 rounding should move the output";
  EXPECT_LT(diff, 5e-2) << "but only by ~1/254 of each block's largest value";
}

// quantize_kv_q8_0: each value within half its block's scale of q * scale,
// |q| <= 127, the scale the half nearest max|x| / 127 (or the next one up when
// that one would need |q| > 127); an all-zero block, a block with one huge
// value, tiny blocks (half scales below the normal range) and non-finite ones.
TEST(KernelKvQ8, QuantizeRoundTrip) {
  std::mt19937 rng(14);
  constexpr size_t kBlocks = 12, kN = kBlocks * kKvQ8Block;
  std::vector<float> x(kN);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& e : x) e = dist(rng);
  std::fill_n(x.begin() + 1 * 32, 32, 0.0f);               // all zero
  x[2 * 32 + 7] = 1e4f;                                    // one huge value among ~1
  for (size_t i = 0; i < 32; ++i) x[3 * 32 + i] *= 1e-6f;  // scale below half's normals
  for (size_t i = 0; i < 32; ++i) x[4 * 32 + i] *= 1e-9f;  // below its subnormals
  for (size_t i = 0; i < 32; ++i) x[5 * 32 + i] = 127.0f * (i % 3 ? 0.5f : -1.0f);  // exact
  for (size_t i = 0; i < 32; ++i) x[6 * 32 + i] *= 3e4f;                            // large
  x[7 * 32 + 3] = -2.0f;  // max |x| negative
  std::vector<int8_t> qv(kN);
  std::vector<uint16_t> sc(kBlocks);
  quantize_kv_q8_0(x.data(), kN, qv.data(), sc.data());
  for (size_t b = 0; b < kBlocks; ++b) {
    const float s = f16_to_float(sc[b]);
    float amax = 0.0f;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    EXPECT_LE(amax, 127.0f * s) << "block " << b;
    // No smaller half scale would do: the one below gives |x| / s > 127.
    if (sc[b] > 0) {
      EXPECT_GT(amax, 127.0f * f16_to_float(sc[b] - 1)) << "block " << b;
    }
    for (size_t i = 0; i < 32; ++i) {
      const size_t e = b * 32 + i;
      EXPECT_GE(qv[e], -127) << e;
      EXPECT_LE(std::fabs(x[e] - static_cast<float>(qv[e]) * s), 0.5f * s)
          << "block " << b << " element " << i << " x " << x[e] << " q " << int{qv[e]} << " s "
          << s;
    }
  }
  EXPECT_EQ(sc[1], 0);  // all zero: scale 0, q 0
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(qv[32 + i], 0);
  EXPECT_EQ(qv[2 * 32 + 7], 127);                          // the huge value is the block's max
  EXPECT_NEAR(f16_to_float(sc[2]), 1e4f / 127.0f, 0.05f);  // ... and sets the scale
  EXPECT_EQ(f16_to_float(sc[5]), 1.0f);                    // 127 / 127 exactly
  EXPECT_EQ(qv[5 * 32], -127);
  EXPECT_EQ(qv[7 * 32 + 3], -127);

  // NaN or inf anywhere in a block: a NaN scale (reads back NaN, as fp32 would hold it).
  std::vector<float> bad(64, 0.5f);
  bad[5] = std::nanf("");
  bad[32 + 9] = -INFINITY;
  std::vector<int8_t> bq(64);
  std::vector<uint16_t> bs(2);
  quantize_kv_q8_0(bad.data(), 64, bq.data(), bs.data());
  EXPECT_TRUE(std::isnan(f16_to_float(bs[0])));
  EXPECT_TRUE(std::isnan(f16_to_float(bs[1])));
}

// The AVX-512 widening the attention kernels share: q * scale exactly, rows
// apart, and under Fault::kv_scale_wrong_block a block takes its neighbour's.
TEST(KernelKvQ8, Avx512DequantizeIsExact) {
  if (detect_isa() < Isa::avx512) GTEST_SKIP() << "no avx512 on this CPU";
  std::mt19937 rng(15);
  for (size_t hd : {32, 64, 96, 256}) {
    const size_t rows = 37;
    OddBuffer x = random_buffer(rows * hd, rng, -3.0f, 3.0f);
    vary_block_magnitudes(x, rng, -6.0f, 6.0f);
    const Q8Cache c(x);
    const OddBuffer want = c.widened();
    const size_t out_stride = hd + 5;
    std::vector<float> got(rows * out_stride, -1.0f);
    avx512::dequantize_q8_0(c.data(), c.scales(), rows, hd, got.data(), out_stride);
    for (size_t r = 0; r < rows; ++r)
      for (size_t d = 0; d < hd; ++d)
        ASSERT_EQ(got[r * out_stride + d], want[r * hd + d]) << hd << " " << r << " " << d;
    for (size_t r = 0; r < rows; ++r)  // the gaps between rows untouched
      ASSERT_EQ(got[r * out_stride + hd], -1.0f);
    if (hd == 32) continue;  // one block per row: no neighbour
    avx512::dequantize_q8_0(c.data(), c.scales(), rows, hd, got.data(), out_stride,
                            {0, /*neighbour_scale=*/true});
    size_t differ = 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t d = 0; d < hd; ++d) differ += got[r * out_stride + d] != want[r * hd + d];
    EXPECT_GT(differ, rows * hd / 2) << hd;
  }
}

// --- element-wise -------------------------------------------------------------

class KernelRmsnorm : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelRmsnorm, ::testing::ValuesIn(tiers_of("rmsnorm")), tier_name);

TEST_P(KernelRmsnorm, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(10);
  IsaScope scope(isa);
  std::vector<size_t> dims;
  for (size_t d = 1; d <= 70; ++d) dims.push_back(d);
  for (size_t d : {256, 576, 640, 2048}) dims.push_back(d);
  for (size_t dim : dims) {
    const OddBuffer x = random_buffer(dim, rng, -3.0f, 3.0f);
    const OddBuffer w = random_buffer(dim, rng);
    std::vector<float> want(dim);
    OddBuffer got(dim);
    ref::rmsnorm(x.data(), w.data(), dim, 1e-6f, want.data());
    rmsnorm(x.data(), w.data(), dim, 1e-6f, got.data());
    ASSERT_TRUE(got.guard_intact());
    // Same rounding sequence up to 1 ulp in the scale: a few eps relative.
    for (size_t i = 0; i < dim; ++i)
      ASSERT_NEAR(got[i], want[i], 4 * kEps * std::fabs(want[i]) + 1e-30)
          << isa_name(isa) << " dim=" << dim << " i=" << i;
    // In place (x aliases y), as the forward pass calls it.
    OddBuffer inplace = x;
    rmsnorm(inplace.data(), w.data(), dim, 1e-6f, inplace.data());
    for (size_t i = 0; i < dim; ++i) ASSERT_EQ(inplace[i], got[i]) << "dim=" << dim;
  }
}

class KernelRope : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelRope, ::testing::ValuesIn(tiers_of("rope")), tier_name);

TEST_P(KernelRope, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(11);
  IsaScope scope(isa);
  for (size_t hd : {2, 4, 8, 14, 16, 18, 24, 32, 48, 64, 80, 96, 128, 256}) {
    // Full rotary, and partial ones (Phi-3's 0.75 and 0.5, odd halves, a single pair).
    std::vector<size_t> rotary = {hd, 2};
    for (size_t r : {hd * 3 / 4, hd / 2, hd - 2})
      if (r % 2 == 0 && r >= 2) rotary.push_back(r);
    for (size_t rot : rotary) {
      for (size_t heads : {1, 3, 12}) {
        const size_t half = rot / 2;
        const OddBuffer x0 = random_buffer(heads * hd, rng, -4.0f, 4.0f);
        const OddBuffer cs = random_buffer(half, rng), sn = random_buffer(half, rng);
        std::vector<float> want(x0.data(), x0.data() + heads * hd);
        OddBuffer got = x0;
        ref::rope(want.data(), heads, hd, rot, cs.data(), sn.data());
        rope(got.data(), heads, hd, rot, cs.data(), sn.data());
        ASSERT_TRUE(got.guard_intact());
        for (size_t h = 0; h < heads; ++h) {
          for (size_t i = 0; i < hd; ++i) {
            if (i >= rot) {  // past the rotary dims, the head passes through untouched
              ASSERT_EQ(got[h * hd + i], x0[h * hd + i])
                  << isa_name(isa) << " hd=" << hd << " rot=" << rot << " i=" << i;
              ASSERT_EQ(want[h * hd + i], x0[h * hd + i]) << "scalar hd=" << hd << " i=" << i;
              continue;
            }
            const size_t j = i < half ? i : i - half;
            const float a = x0[h * hd + j], b = x0[h * hd + j + half];
            const float expect = i < half ? a * cs[j] - b * sn[j] : b * cs[j] + a * sn[j];
            const double mag = std::fabs(a * cs[j]) + std::fabs(b * sn[j]) + std::fabs(b * cs[j]) +
                               std::fabs(a * sn[j]);
            ASSERT_NEAR(want[h * hd + i], expect, kEps * mag + 1e-30)
                << "scalar hd=" << hd << " rot=" << rot << " i=" << i;
            ASSERT_NEAR(got[h * hd + i], want[h * hd + i], 2 * kEps * mag + 1e-30)
                << isa_name(isa) << " hd=" << hd << " rot=" << rot << " h=" << h << " i=" << i;
          }
        }
      }
    }
  }
}

// Activation inputs spanning the interesting range, plus the far tails where
// exp under/overflows.
OddBuffer activation_inputs(size_t n, std::mt19937& rng) {
  OddBuffer g = random_buffer(n, rng, -12.0f, 12.0f);
  const float tails[] = {-120.0f, -90.0f, -88.5f, -30.0f, -1e-3f, 0.0f, 1e-3f, 30.0f, 90.0f};
  for (size_t i = 0; i < n && i < std::size(tails); ++i) g[(i * 7) % n] = tails[i];
  return g;
}

class KernelSiluMul : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelSiluMul, ::testing::ValuesIn(tiers_of("silu_mul")),
                         tier_name);

TEST_P(KernelSiluMul, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(12);
  IsaScope scope(isa);
  for (size_t n = 0; n <= 70; ++n) {
    const OddBuffer g = activation_inputs(n, rng), u = random_buffer(n, rng, -2.0f, 2.0f);
    std::vector<float> want(n);
    OddBuffer got(n);
    ref::silu_mul(g.data(), u.data(), n, want.data());
    silu_mul(g.data(), u.data(), n, got.data());
    ASSERT_TRUE(got.guard_intact());
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-37)
          << isa_name(isa) << " g=" << g[i] << " n=" << n;
  }
}

class KernelGeluTanhMul : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelGeluTanhMul, ::testing::ValuesIn(tiers_of("gelu_tanh_mul")),
                         tier_name);

TEST_P(KernelGeluTanhMul, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(13);
  IsaScope scope(isa);
  for (size_t n = 0; n <= 70; ++n) {
    const OddBuffer g = activation_inputs(n, rng), u = random_buffer(n, rng, -2.0f, 2.0f);
    std::vector<float> want(n);
    OddBuffer got(n);
    ref::gelu_tanh_mul(g.data(), u.data(), n, want.data());
    gelu_tanh_mul(g.data(), u.data(), n, got.data());
    ASSERT_TRUE(got.guard_intact());
    // The reference's 1 + tanh(z) cancels for z << 0 and is then only good
    // to eps absolute: its error is ~eps * |g * up| / 2, hence the second term.
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-7 * std::fabs(g[i] * u[i]))
          << isa_name(isa) << " g=" << g[i] << " n=" << n;
  }
}

class KernelSwigluOaiMul : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelSwigluOaiMul, ::testing::ValuesIn(tiers_of("swiglu_oai_mul")),
                         tier_name);

// Every tier against the reference: n from 0 to 70 (tails under a lane mask), gate and up
// both past the limit on each side, exp's far tails, NaN kept.
TEST_P(KernelSwigluOaiMul, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(15);
  IsaScope scope(isa);
  for (size_t n = 0; n <= 70; ++n) {
    const OddBuffer g = activation_inputs(n, rng), u = random_buffer(n, rng, -10.0f, 10.0f);
    std::vector<float> want(n);
    OddBuffer got(n);
    ref::swiglu_oai_mul(g.data(), u.data(), n, 7.0f, want.data());
    swiglu_oai_mul(g.data(), u.data(), n, 7.0f, got.data());
    ASSERT_TRUE(got.guard_intact());
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-37)
          << isa_name(isa) << " g=" << g[i] << " u=" << u[i] << " n=" << n;
  }
  const float nan = std::nanf(""), one = 1.0f;
  float out = 0.0f;
  swiglu_oai_mul(&nan, &one, 1, 7.0f, &out);
  EXPECT_TRUE(std::isnan(out)) << isa_name(isa) << ": a NaN gate must not clamp to the limit";
  swiglu_oai_mul(&one, &nan, 1, 7.0f, &out);
  EXPECT_TRUE(std::isnan(out)) << isa_name(isa) << ": a NaN up must not clamp to the limit";
}

// HF GptOssExperts' formula on values either side of the clamps, in double.
TEST(KernelSwigluOaiReference, ClampsAndGlu) {
  const float gate[] = {-9.0f, -1.0f, 0.5f, 6.9f, 7.5f, 30.0f};
  const float up[] = {-12.0f, 8.0f, -0.3f, 7.0f, -6.5f, 100.0f};
  float out[6];
  ref::swiglu_oai_mul(gate, up, 6, 7.0f, out);
  for (int i = 0; i < 6; ++i) {
    const double g = std::min(double{gate[i]}, 7.0), u = std::clamp(double{up[i]}, -7.0, 7.0);
    const double want = (u + 1.0) * g / (1.0 + std::exp(-1.702 * g));
    EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-6) << "gate " << gate[i];
  }
}

class KernelAdd : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelAdd, ::testing::ValuesIn(tiers_of("add")), tier_name);

TEST_P(KernelAdd, Sweep) {
  const Isa isa = GetParam();
  std::mt19937 rng(14);
  IsaScope scope(isa);
  for (size_t n = 0; n <= 70; ++n) {
    const OddBuffer x = random_buffer(n, rng);
    OddBuffer want = random_buffer(n, rng), got = want;
    ref::add(want.data(), x.data(), n);
    add(got.data(), x.data(), n);
    ASSERT_TRUE(got.guard_intact());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " n=" << n;
  }
}

// The vector exp/tanh behind the activations and the softmax, held to the
// std:: versions element by element.
TEST(KernelVecMath, ExpMatchesStd) {
  if (detect_isa() < Isa::avx2) GTEST_SKIP() << "this CPU lacks the avx2 tier";
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.7f; v += 0.000731f) x.push_back(v);
  std::vector<float> got(x.size());
  avx2::exp_array(x.data(), x.size(), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    ASSERT_NEAR(got[i], want, 1e-6 * want) << "x=" << x[i];
  }
  // Denormal results, overflow, and the special values.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edge = {-100.0f, -95.5f, -88.0f, -104.0f, -200.0f,
                             -inf,    88.8f,  100.0f, inf,     0.0f};
  std::vector<float> e_got(edge.size());
  avx2::exp_array(edge.data(), edge.size(), e_got.data());
  for (size_t i = 0; i < edge.size(); ++i) {
    const float want = std::exp(edge[i]);
    if (std::isinf(want)) {
      EXPECT_EQ(e_got[i], inf) << edge[i];
    } else {  // denormals carry fewer bits: absolute, in units of the smallest normal
      EXPECT_NEAR(e_got[i], want, 1e-6 * want + 1e-6 * std::numeric_limits<float>::min())
          << edge[i];
    }
  }
  const float nan = std::nanf("");
  float nan_out = 0.0f;
  avx2::exp_array(&nan, 1, &nan_out);
  EXPECT_TRUE(std::isnan(nan_out));
}

TEST(KernelVecMath, TanhMatchesStd) {
  if (detect_isa() < Isa::avx2) GTEST_SKIP() << "this CPU lacks the avx2 tier";
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.000317f) x.push_back(v);
  for (float v = 1e-30f; v < 1.0f; v *= 1.7f) {
    x.push_back(v);
    x.push_back(-v);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 0.625f, -0.625f, 0.62499f, 20.0f, -50.0f, inf, -inf}) x.push_back(v);
  std::vector<float> got(x.size());
  avx2::tanh_array(x.data(), x.size(), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::tanh(x[i]);
    ASSERT_NEAR(got[i], want, 1e-6 * std::fabs(want)) << "x=" << x[i];
  }
}

// --- top_k --------------------------------------------------------------------

class KernelTopK : public TierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, KernelTopK, ::testing::ValuesIn(tiers_of("top_k")), tier_name);

TEST_P(KernelTopK, MatchesReferenceWithTies) {
  const Isa isa = GetParam();
  std::mt19937 rng(15);
  IsaScope scope(isa);
  for (size_t n = 0; n <= 90; ++n) {
    for (size_t k : {size_t{0}, size_t{1}, size_t{2}, size_t{5}, n / 2, n, n + 3}) {
      // Few distinct values, so ties are everywhere.
      std::uniform_int_distribution<int> level(-3, 3);
      OddBuffer x(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(level(rng));
      if (n > 4) x[n / 3] = -std::numeric_limits<float>::infinity();
      const size_t kk = std::min(k, n);
      std::vector<int32_t> want(kk + 1, -7), got(kk + 1, -7);
      ref::top_k(x.data(), n, k, want.data());
      top_k(x.data(), n, k, got.data());
      ASSERT_EQ(got, want) << isa_name(isa) << " n=" << n << " k=" << k;
    }
  }
}

TEST_P(KernelTopK, VocabSized) {
  const Isa isa = GetParam();
  std::mt19937 rng(16);
  IsaScope scope(isa);
  for (size_t n : {49152, 262144}) {
    OddBuffer x = random_buffer(n, rng, -10.0f, 10.0f);
    for (size_t i = 0; i < n; i += 97) x[i] = 9.5f;  // a band of ties near the top
    for (size_t k : {1, 5, 40, 256, 300}) {
      std::vector<int32_t> want(k), got(k);
      ref::top_k(x.data(), n, k, want.data());
      top_k(x.data(), n, k, got.data());
      ASSERT_EQ(got, want) << isa_name(isa) << " n=" << n << " k=" << k;
    }
    // Ascending input: every element enters the buffer (worst case).
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * 1e-3f;
    std::vector<int32_t> want(50), got(50);
    ref::top_k(x.data(), n, 50, want.data());
    top_k(x.data(), n, 50, got.data());
    ASSERT_EQ(got, want) << isa_name(isa) << " ascending n=" << n;
  }
}

// NaN logits (a broken model, an overflow) get a defined order: below every
// number, -inf included; among themselves by index.
TEST_P(KernelTopK, NanRanksLast) {
  const Isa isa = GetParam();
  IsaScope scope(isa);
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(18);
  for (size_t n : {1, 5, 8, 9, 17, 40, 1000}) {
    OddBuffer x = random_buffer(n, rng, -5.0f, 5.0f);
    for (size_t i = 0; i < n; i += 3) x[i] = nan;
    if (n > 4) x[n - 2] = -inf;
    for (size_t k : {size_t{1}, size_t{2}, n / 2, n - 1, n, n + 2}) {
      const size_t kk = std::min(k, n);
      std::vector<int32_t> want(kk), got(kk);
      ref::top_k(x.data(), n, k, want.data());
      top_k(x.data(), n, k, got.data());
      ASSERT_EQ(got, want) << isa_name(isa) << " n=" << n << " k=" << k;
      // The defined order, independently of either implementation: numbers
      // descending (ties by index), then NaNs by index.
      std::vector<int32_t> order(n);
      for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        if (std::isnan(x[a]) || std::isnan(x[b])) return !std::isnan(x[a]) && std::isnan(x[b]);
        return x[a] > x[b];
      });
      order.resize(kk);
      ASSERT_EQ(got, order) << isa_name(isa) << " n=" << n << " k=" << k;
    }
  }
  // All NaN: indices in order.
  std::vector<float> all(11, nan);
  std::vector<int32_t> got(4);
  top_k(all.data(), all.size(), 4, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3})) << isa_name(isa);
}

// --- ISA selection ------------------------------------------------------------

TEST(KernelDispatch, ParseIsa) {
  for (Isa isa : kAllIsas) {
    EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  }
  EXPECT_EQ(parse_isa("scalar"), Isa::scalar);
  EXPECT_EQ(parse_isa("avx2"), Isa::avx2);
  EXPECT_EQ(parse_isa("avx512"), Isa::avx512);
  EXPECT_EQ(parse_isa("amx"), Isa::amx);
  for (const char* bad : {"", "AVX2", "avx", "avx-512", "avx512 ", " amx", "sse", "native"})
    EXPECT_EQ(parse_isa(bad), std::nullopt) << "'" << bad << "'";
}

// The clamp is runnable_isa(): the CPU's best tier, or amx where the test
// binary runs the amx tier on the tile model (AVX-512 without AMX).
TEST(KernelDispatch, SetIsaClampsToTheCpu) {
  const Isa detected = detect_isa();
  const Isa runnable = runnable_isa();
  EXPECT_EQ(default_isa(), detected);  // AMX included: its fp32 GEMM is exact-split
  EXPECT_EQ(runnable,
            tile_backend() == TileBackend::model && detected == Isa::avx512 ? Isa::amx : detected);
  for (Isa isa : kAllIsas) {
    IsaScope scope(isa);
    EXPECT_EQ(active_isa(), std::min(isa, runnable)) << isa_name(isa);
    const PackedMatrix m = pack_matrix(nullptr, 0, 0, isa);
    EXPECT_EQ(m.isa, std::min(isa, runnable)) << isa_name(isa);
  }
}

// The type-traits table: every format has a scalar row, packing picks the row
// of the tier asked (clamped to the CPU, else the best lower row), and a copy
// of a matrix keeps its row and its bias.
TEST(KernelDispatch, PackingPicksTheTraitsRowOfTheTier) {
  for (WeightFormat f : {WeightFormat::bf16, WeightFormat::quant}) {
    EXPECT_EQ(matmul_kernels(f, Isa::scalar).tier, Isa::scalar) << weight_format_name(f);
    for (Isa isa : kAllIsas) {
      const MatmulKernels& k = matmul_kernels(f, isa);
      EXPECT_EQ(k.format, f);
      EXPECT_LE(k.tier, std::min(isa, runnable_isa()));
      EXPECT_TRUE(k.gemv && k.gemm && k.rows && k.unpack_row && k.bytes);
    }
  }
  std::mt19937 rng(2);
  const std::vector<uint16_t> w = random_bf16(5 * 7, rng);
  for (Isa isa : kAllIsas) {
    PackedMatrix m = pack_matrix(w.data(), 5, 7, isa);
    EXPECT_EQ(m.kernels, &matmul_kernels(WeightFormat::bf16, isa)) << isa_name(isa);
    EXPECT_EQ(m.kernels->tier, m.isa);
    m.bias = Bias(std::vector<float>{1, 2, 3, 4, 5});
    const PackedMatrix copy = m;
    m = PackedMatrix{};  // the copy's bias outlives the original
    ASSERT_NE(copy.bias.get(), nullptr);
    EXPECT_EQ(copy.bias[4], 5.0f);
    EXPECT_EQ(copy.kernels->format, WeightFormat::bf16);
  }
}

// Tiers are cumulative: a CPU with AVX-512 reports it only if it also has AVX2.
TEST(KernelDispatch, DetectionMatchesCompilerProbe) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(detect_isa() >= Isa::avx2, avx2);
  if (detect_isa() >= Isa::avx512) {
    EXPECT_TRUE(__builtin_cpu_supports("avx512f"));
    EXPECT_TRUE(__builtin_cpu_supports("avx512bw"));
    EXPECT_TRUE(__builtin_cpu_supports("avx512vl"));
  }
#else
  EXPECT_EQ(detect_isa(), Isa::scalar);
#endif
}

}  // namespace
}  // namespace edgellm::kernels
