// Context::prefill_packed (tiny random checkpoints): several sequences side by
// side in one cache give each one's last row and logits bit for bit as a
// prefill of that sequence alone, for every KV dtype and ISA tier; bad calls
// are errors naming the input.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/session.h"
#include "tiny_model.h"

namespace edgellm {
namespace {

using testing::TinyModel;
using testing::write_tiny_session_model;

constexpr int kContext = 128;

// head_dim 32 so that q8_0 and the bf16 attention kernels apply.
Model fast_model(const std::string& kv, const std::string& isa) {
  static const TinyModel m =
      write_tiny_session_model(R"(, "head_dim": 32, "max_position_embeddings": 128)");
  return testing::fast_model(m, kv, kContext, isa);
}

std::vector<int32_t> prompt(size_t n, int seed) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((7 * i + 3 * seed + 1) % 90);
  return p;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// (KV dtype, ISA tier; "" is the CPU's best). A tier the CPU lacks runs its best.
class PrefillPacked : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

INSTANTIATE_TEST_SUITE_P(KvDtypes, PrefillPacked,
                         ::testing::Combine(::testing::Values("fp32", "bf16", "q8_0"),
                                            ::testing::Values("", "avx2", "scalar")));

// Sequences of >= kMinPrefillChunk tokens (so alone they run the prefill
// kernels too), at cache slots 0, 20 and 57: none sees another's keys.
TEST_P(PrefillPacked, EachSequenceIsItsOwnPrefill) {
  const Model model = fast_model(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const size_t H = static_cast<size_t>(model.config().hidden_size);
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  const std::vector<std::vector<int32_t>> inputs = {prompt(20, 1), prompt(37, 2), prompt(16, 3)};
  const std::vector<std::span<const int32_t>> spans(inputs.begin(), inputs.end());
  Context packed(model);
  std::vector<float> hidden(inputs.size() * H), logits(inputs.size() * V);
  packed.prefill_packed(spans, hidden, logits);
  EXPECT_EQ(packed.position(), 0);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Context alone(model);
    PrefillCapture capture;
    const std::span<const float> expected = alone.prefill(inputs[i], 0, &capture);
    const std::span<const float> last(&capture.final_hidden[(inputs[i].size() - 1) * H], H);
    EXPECT_TRUE(same_bits(std::span(hidden).subspan(i * H, H), last)) << "input " << i;
    EXPECT_TRUE(same_bits(std::span(logits).subspan(i * V, V), expected)) << "input " << i;
  }
  std::vector<float> hidden_only(inputs.size() * H);
  packed.prefill_packed(spans, hidden_only);  // no logits asked: the same rows
  EXPECT_TRUE(same_bits(hidden_only, hidden));
}

TEST(PrefillPackedErrors, NameTheInput) {
  const Model model = fast_model("fp32", "");
  const size_t H = static_cast<size_t>(model.config().hidden_size);
  Context c(model);
  const std::vector<int32_t> ok = prompt(5, 1), empty, bad = {3, 97}, long_one = prompt(100, 2);
  std::vector<float> one(H), two(2 * H);
  const auto message = [&](std::vector<std::span<const int32_t>> inputs, std::span<float> out,
                           std::span<float> logits = {}) {
    try {
      c.prefill_packed(inputs, out, logits);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({}, {}), "prefill_packed needs at least one input");
  EXPECT_EQ(message({ok, ok}, one),
            "prefill_packed: the output buffers do not hold one row per input");
  EXPECT_EQ(message({ok}, one, one),
            "prefill_packed: the output buffers do not hold one row per input");
  EXPECT_EQ(message({ok, empty}, two), "input 1 has no tokens");
  EXPECT_EQ(message({ok, bad}, two), "token id 97 is outside the vocabulary");
  EXPECT_EQ(message({long_one, long_one}, two),
            "inputs of 200+ tokens in all exceed the context of 128 tokens");
  EXPECT_EQ(message({ok}, one), "no error");
}

}  // namespace
}  // namespace edgellm
