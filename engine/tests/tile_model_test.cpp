// The amx tier's two tile back ends (kernels/amx_tiles.h).
//
// Where the CPU has AVX-512 but no AMX, this binary runs the whole amx tier on
// the exact tile model (the environment below), so every amx test in the
// suite runs on every such machine; EDGELLM_TEST_TILE_MODEL=1 does the same on
// an AMX machine. Where AMX exists, the tests here hold the model to the
// silicon bit for bit, one instruction at a time, on random shapes and the
// values where an approximate model would part from it (denormals, signed
// zeros, cancellation, rounding ties, int32 wraparound); kernels_test and
// quant_test do the same for every amx kernel on odd shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/kernels.h"

namespace edgellm::kernels {
namespace {

class TileBackendEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("EDGELLM_TEST_TILE_MODEL");
    const bool asked = env != nullptr && std::string_view(env) == "1";
    if (detect_isa() == Isa::avx512 || (asked && detect_isa() == Isa::amx))
      set_tile_backend(TileBackend::model);
  }
};
[[maybe_unused]] ::testing::Environment* const kTileEnvironment =
    ::testing::AddGlobalTestEnvironment(new TileBackendEnvironment);

// Which back end the amx tier runs on in this binary (the CI summary reads it).
TEST(TileModel, ReportsTheAmxBackEnd) {
  if (runnable_isa() < Isa::amx) {
    std::printf("[ tiles    ] amx tier not runnable here: best tier %s, no AVX-512 for the model\n",
                std::string(isa_name(detect_isa())).c_str());
    EXPECT_LT(detect_isa(), Isa::avx512);  // else the model would run it
    return;
  }
  std::printf("[ tiles    ] amx tier runs on: %s\n",
              std::string(tile_backend_name(tile_backend())).c_str());
  if (detect_isa() == Isa::avx512) {
    EXPECT_EQ(tile_backend(), TileBackend::model);
  }
}

bool skip_without_silicon() {
  return detect_isa() != Isa::amx;
}
constexpr const char* kNoSilicon =
    "no AMX on this CPU: nothing to hold the model to (the amx tier's tests run on the model)";

// A random configuration of tmm0 = C (M x N fp32 / int32), tmm1 = A (M rows x
// K dwords), tmm2 = B (K rows x N dwords), as a dot product needs them.
amx::TileConfig random_dot_config(std::mt19937& rng) {
  std::uniform_int_distribution<int> dim(1, 16);
  const int m = dim(rng), k = dim(rng), n = dim(rng);
  amx::TileConfig cfg;
  cfg.rows[0] = m, cfg.colsb[0] = 4 * n;
  cfg.rows[1] = m, cfg.colsb[1] = 4 * k;
  cfg.rows[2] = k, cfg.colsb[2] = 4 * n;
  return cfg;
}

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// A bf16 that exercises the arithmetic: mostly moderate values over a wide
// range of exponents, with denormals, zeros of both signs, and exact powers
// of two (ties when summed).
uint16_t spicy_bf16(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 19), exponent(-40, 40);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  switch (kind(rng)) {
    case 0:
      return static_cast<uint16_t>((rng() & 0x8000u) | (rng() & 0x7fu));  // denormal (or 0)
    case 1:
      return static_cast<uint16_t>(rng() & 0x8000u);  // +-0
    case 2:
      return static_cast<uint16_t>(float_bits(std::ldexp(1.0f, exponent(rng))) >> 16);
    default:
      return static_cast<uint16_t>(float_bits(unit(rng) * std::ldexp(1.0f, exponent(rng))) >> 16);
  }
}

float spicy_fp32(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 9), exponent(-40, 40);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const float x = unit(rng) * std::ldexp(1.0f, exponent(rng));
  if (kind(rng) == 0) return std::ldexp(x, -120);  // denormal accumulator
  return x;
}

// Runs op on both back ends from the same tiles; fails on the first bit that differs.
void expect_same(amx::TileOp op, const amx::TileConfig& cfg, const std::vector<uint8_t>& c,
                 const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t stride,
                 int trial) {
  std::vector<uint8_t> on_silicon(c.size(), 0xa5), on_model(c.size(), 0xa5);
  amx::run_tile_op(TileBackend::silicon, op, cfg, c.data(), a.data(), b.data(), on_silicon.data(),
                   stride);
  amx::run_tile_op(TileBackend::model, op, cfg, c.data(), a.data(), b.data(), on_model.data(),
                   stride);
  for (size_t i = 0; i < c.size(); ++i)
    ASSERT_EQ(on_silicon[i], on_model[i])
        << "trial " << trial << " byte " << i << " (row " << i / stride
        << ") of C, shape M=" << int(cfg.rows[0]) << " K=" << cfg.colsb[1] / 4
        << " N=" << cfg.colsb[0] / 4 << " stride " << stride;
}

TEST(TileModel, Bf16DotMatchesSilicon) {
  if (skip_without_silicon()) GTEST_SKIP() << kNoSilicon;
  std::mt19937 rng(41);
  for (int trial = 0; trial < 400; ++trial) {
    const amx::TileConfig cfg = random_dot_config(rng);
    const size_t stride = 64 + 4 * (rng() % 5);  // rows of other tiles' widths apart
    std::vector<uint8_t> c(16 * stride), a(16 * stride), b(16 * stride);
    for (size_t i = 0; i + 4 <= c.size(); i += 4) {
      const float v = spicy_fp32(rng);
      std::memcpy(&c[i], &v, 4);
    }
    for (size_t i = 0; i + 2 <= a.size(); i += 2) {
      const uint16_t va = spicy_bf16(rng), vb = spicy_bf16(rng);
      std::memcpy(&a[i], &va, 2);
      std::memcpy(&b[i], &vb, 2);
    }
    expect_same(amx::TileOp::dpbf16ps, cfg, c, a, b, stride, trial);
    if (HasFatalFailure()) return;
  }
}

// The case a naive model gets wrong: C + (even sum + odd sum), each sum kept
// in fp32 across K, is not C += a0 b0 + a1 b1 pair by pair.
TEST(TileModel, Bf16DotSumsEvenAndOddProductsApart) {
  const amx::TileConfig cfg = amx::uniform_tile_config();
  std::vector<uint8_t> c(16 * 64, 0), a(16 * 64, 0), b(16 * 64, 0), out(16 * 64);
  const auto put = [](std::vector<uint8_t>& t, size_t i, float x) {
    const uint16_t v = static_cast<uint16_t>(float_bits(x) >> 16);
    std::memcpy(&t[2 * i], &v, 2);
  };
  // C = -2^30; pair 0 = (2^30 * 1, 1 * 1): the even sum 2^30 and the odd sum 1
  // add to 2^30 (fp32), so C ends at 0, where pair-by-pair FMAs give 1.
  const float minus = -std::ldexp(1.0f, 30);
  std::memcpy(&c[0], &minus, 4);
  put(a, 0, std::ldexp(1.0f, 30)), put(a, 1, 1.0f);
  put(b, 0, 1.0f), put(b, 1, 1.0f);
  amx::run_tile_op(tile_backend(), amx::TileOp::dpbf16ps, cfg, c.data(), a.data(), b.data(),
                   out.data(), 64);
  float got;
  std::memcpy(&got, &out[0], 4);
  EXPECT_EQ(got, 0.0f) << "on " << tile_backend_name(tile_backend());
}

TEST(TileModel, Int8DotsMatchSilicon) {
  if (skip_without_silicon()) GTEST_SKIP() << kNoSilicon;
  if (!has_amx_int8()) GTEST_SKIP() << "this CPU has AMX-BF16 but not AMX-INT8";
  std::mt19937 rng(43);
  for (int trial = 0; trial < 200; ++trial) {
    const amx::TileConfig cfg = random_dot_config(rng);
    const size_t stride = 64 + 4 * (rng() % 3);
    std::vector<uint8_t> c(16 * stride), a(16 * stride), b(16 * stride);
    for (size_t i = 0; i + 4 <= c.size(); i += 4) {
      // Near the int32 limits half the time: the sums wrap around.
      const uint32_t v = trial % 2 ? 0x7fffff00u + (rng() & 0x1ffu) : static_cast<uint32_t>(rng());
      std::memcpy(&c[i], &v, 4);
    }
    for (auto& v : a) v = static_cast<uint8_t>(trial % 3 == 0 ? 0x80u | (rng() & 1u) : rng());
    for (auto& v : b) v = static_cast<uint8_t>(trial % 3 == 0 ? 0x7fu + (rng() & 1u) : rng());
    expect_same(amx::TileOp::dpbssd, cfg, c, a, b, stride, trial);
    expect_same(amx::TileOp::dpbusd, cfg, c, a, b, stride, trial);
    if (HasFatalFailure()) return;
  }
}

// The model refuses what the silicon faults on (#UD), with a message.
TEST(TileModelDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<uint8_t> buf(16 * 64);
  amx::TileConfig mismatched = amx::uniform_tile_config();
  mismatched.rows[2] = 8;  // B's rows no longer A's 16 dwords per row
  EXPECT_DEATH(amx::run_tile_op(TileBackend::model, amx::TileOp::dpbf16ps, mismatched, buf.data(),
                                buf.data(), buf.data(), buf.data(), 64),
               "A's dwords per row differ from B's rows");
  amx::TileConfig unconfigured = amx::uniform_tile_config();
  unconfigured.rows[1] = 0;
  unconfigured.colsb[1] = 0;
  EXPECT_DEATH(amx::run_tile_op(TileBackend::model, amx::TileOp::dpbf16ps, unconfigured, buf.data(),
                                buf.data(), buf.data(), buf.data(), 64),
               "tile not configured");
}

}  // namespace
}  // namespace edgellm::kernels
