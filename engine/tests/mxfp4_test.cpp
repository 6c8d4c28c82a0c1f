// MXFP4 blocks (gpt-oss's experts): every code at every exponent the repack
// takes decodes to code * 2^(e - 128) exactly (the E8M0 half-scale, the E2M1
// code doubled: ggml's kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF), subnormal
// half-scales included; exponents whose weights overflow fp32 are refused with
// an error naming the tensor, the block and the row. The kernels' tests
// (quant_test.cpp) run MXFP4 with every other format; tests/test_quant_types.py
// holds the decode to gguf-py's bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "edgellm/error.h"
#include "kernels/quant.h"

namespace edgellm::kernels {
namespace {

// E2M1 code c (sign bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) doubled, from
// the OCP MX spec's definition rather than a table. Code 8 (-0) is +0, as
// ggml's int8 table and so gguf-py decode it.
double doubled_e2m1(int c) {
  const int e = (c >> 1) & 3, m = c & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return mag == 0.0 ? 0.0 : (c & 8 ? -2.0 : 2.0) * mag;
}

// One row of blocks, one per exponent in [first, last]; block b's 32 codes
// cycle through all 16 (twice, in both nibble halves, shifted by b).
std::vector<uint8_t> exponent_row(int first, int last) {
  std::vector<uint8_t> row;
  for (int e = first; e <= last; ++e) {
    row.push_back(static_cast<uint8_t>(e));
    for (int j = 0; j < 16; ++j)
      row.push_back(static_cast<uint8_t>((j + e) % 16 | ((15 - j + e) % 16) << 4));
  }
  return row;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Mxfp4Test, EveryCodeAtEveryExponentDecodesExactly) {
  const int n = kMaxMxfp4Exponent + 1;  // exponents 0 .. 252
  const auto row = exponent_row(0, kMaxMxfp4Exponent);
  QuantMatrix m;
  append_segment(m, repack_gguf(BlockFormat::mxfp4, row.data(), 1, 32 * n));
  std::vector<float> out(32 * n);
  dequant_row(m, 0, out.data());
  for (int e = 0; e < n; ++e)
    for (int j = 0; j < 32; ++j) {
      const int c = j < 16 ? (j + e) % 16 : (15 - (j - 16) + e) % 16;
      const float want = static_cast<float>(std::ldexp(doubled_e2m1(c), e - 128));
      ASSERT_EQ(bits(out[32 * e + j]), bits(want)) << "exponent " << e << " code " << c;
    }
  // The extremes really are there: a subnormal weight, and a finite one above 2^127.
  EXPECT_EQ(out[1], std::ldexp(1.0f, -128));
  EXPECT_TRUE(std::isfinite(out[32 * kMaxMxfp4Exponent + 11]));
  EXPECT_GT(std::fabs(out[32 * kMaxMxfp4Exponent + 11]), std::ldexp(1.0f, 127));
}

// 2^-128 and 2^-127 are fp32 subnormals: the scales must not be flushed.
TEST(Mxfp4Test, SubnormalHalfScalesAreKept) {
  const auto row = exponent_row(0, 1);
  const QuantSegment s = repack_gguf(BlockFormat::mxfp4, row.data(), 1, 64);
  EXPECT_EQ(s.scale(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(s.scale(1), std::ldexp(1.0f, -127));
}

TEST(Mxfp4Test, OverflowingExponentsAreRefusedNamingTheTensor) {
  for (int e = kMaxMxfp4Exponent + 1; e <= 255; ++e) {
    // Row 2's second block is the bad one; every other block is valid.
    auto blocks = exponent_row(120, 125);
    blocks[(2 * 2 + 1) * 17] = static_cast<uint8_t>(e);
    try {
      repack_gguf(BlockFormat::mxfp4, blocks.data(), 3, 64, nullptr, "GGUF tensor 'blk.0.ffn_up'");
      ADD_FAILURE() << "exponent " << e << " was accepted";
    } catch (const Error& err) {
      EXPECT_EQ(std::string(err.what()),
                "GGUF tensor 'blk.0.ffn_up': MXFP4 block 1 of row 2 has exponent byte " +
                    std::to_string(e) + ", above 252 (its weights would overflow fp32)");
    }
  }
}

}  // namespace
}  // namespace edgellm::kernels
