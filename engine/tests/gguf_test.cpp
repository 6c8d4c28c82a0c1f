// The GGUF reader against valid, truncated and corrupt files: every bad file
// must give one edgellm::Error (never a crash, hang or out-of-bounds read).
#include <gtest/gtest.h>

#include <random>

#include "edgellm/error.h"
#include "gguf_writer.h"
#include "io/gguf.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::GgufWriter;

std::vector<uint8_t> q8_0_blocks(size_t n_blocks) {
  std::vector<uint8_t> b(n_blocks * 34);
  for (size_t i = 0; i < n_blocks; ++i) {
    b[i * 34] = 0x00;
    b[i * 34 + 1] = 0x3c;  // f16 1.0
    for (int j = 0; j < 32; ++j) b[i * 34 + 2 + j] = static_cast<uint8_t>(j - 16);
  }
  return b;
}

GgufWriter valid_writer() {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.tensor("token_embd.weight", 8, {64, 3}, q8_0_blocks(6));
  std::vector<uint8_t> norm(64 * 4, 0);
  w.tensor("output_norm.weight", 0, {64}, norm);
  return w;
}

class GgufTest : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = testing::make_temp_dir("gguf");
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::vector<uint8_t>& bytes) {
    auto p = dir_ / "m.gguf";
    testing::write_text(p, std::string(bytes.begin(), bytes.end()));
    return p;
  }
  // Opening must fail with an Error whose message contains `needle`.
  void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
    try {
      GgufFile::open(write(bytes));
      ADD_FAILURE() << "opened a bad file; expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
};

TEST_F(GgufTest, ReadsMetadataAndTensors) {
  const auto g = GgufFile::open(write(valid_writer().bytes()));
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*g.get_float("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"a", "b", "<s>"}));
  EXPECT_FALSE(g.get_int("absent").has_value());
  EXPECT_THROW(g.get_int("general.architecture"), Error);  // a string, not an integer

  const GgufTensor* t = g.find("token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::Q8_0);
  EXPECT_EQ(t->cols(), 64u);
  EXPECT_EQ(t->rows(), 3u);
  EXPECT_EQ(t->nbytes, 6u * 34);
  EXPECT_EQ(t->data[1], 0x3c);
  EXPECT_EQ(static_cast<int8_t>(t->data[2]), -16);
  const GgufTensor* n = g.find("output_norm.weight");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(n->data) - reinterpret_cast<uintptr_t>(t->data), 224u);
}

TEST_F(GgufTest, EveryTruncationIsAnError) {
  const auto bytes = valid_writer().bytes();
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE("prefix of " + std::to_string(len) + " bytes");
    EXPECT_THROW(GgufFile::open(write({bytes.begin(), bytes.begin() + len})), Error);
  }
}

TEST_F(GgufTest, RandomCorruptionNeverCrashes) {
  const auto good = valid_writer().bytes();
  std::mt19937 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = good;
    const int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f)
      bytes[rng() % bytes.size()] = static_cast<uint8_t>(trial % 3 == 0 ? 0xff : rng());
    try {
      const auto g = GgufFile::open(write(bytes));
      for (const auto& [name, t] : g.tensors()) {  // what opened must be readable
        volatile uint8_t sink = t.nbytes ? t.data[t.nbytes - 1] : 0;
        (void)sink;
      }
      (void)g.get_string_array("tokenizer.ggml.tokens");
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);  // the corruptions were noticed, not all silently accepted
}

TEST_F(GgufTest, BadHeaderFields) {
  auto bytes = valid_writer().bytes();
  auto b = bytes;
  b[0] = 'X';
  expect_error(b, "bad magic");
  expect_error(valid_writer().bytes(1), "version 1 is not supported");
  b = bytes;
  b[8] = 0xff;  // tensor count low byte
  b[15] = 0x7f;
  expect_error(b, "tensor count");
  b = bytes;
  b[16 + 7] = 0x7f;  // metadata count high byte
  expect_error(b, "metadata count");
  b = bytes;
  b[24 + 7] = 0x7f;  // first key's length
  expect_error(b, "metadata key #0");
}

TEST_F(GgufTest, BadTensorInfos) {
  {
    GgufWriter w;
    w.tensor("x", 99, {32}, std::vector<uint8_t>(32));
    expect_error(w.bytes(), "tensor 'x' has GGML type 99");
  }
  {
    GgufWriter w;
    w.tensor("x", 8, {48}, std::vector<uint8_t>(68));
    expect_error(w.bytes(), "not a multiple of Q8_0's block of 32");
  }
  {
    GgufWriter w;
    w.tensor("x", 0, {4, 0}, {});
    expect_error(w.bytes(), "dimension 1 is 0");
  }
  {
    GgufWriter w;
    w.tensor("x", 0, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4));
    expect_error(w.bytes(), "5 dimensions");
  }
  {
    GgufWriter w;
    w.tensor("x", 0, {uint64_t{1} << 39, uint64_t{1} << 39}, {});
    expect_error(w.bytes(), "too large");
  }
  {
    GgufWriter w;
    w.tensor("x", 0, {16}, std::vector<uint8_t>(64));
    w.tensor("x", 0, {16}, std::vector<uint8_t>(64));
    expect_error(w.bytes(), "appears twice");
  }
  {
    GgufWriter w;
    w.tensor("x", 0, {1024}, std::vector<uint8_t>(64));  // claims 4096 bytes
    expect_error(w.bytes(), "runs past the end");
  }
  {
    GgufWriter w;
    w.kv_u32("general.alignment", 24);
    expect_error(w.bytes(), "not a power of two");
  }
}

TEST_F(GgufTest, MisalignedAndOverlappingData) {
  GgufWriter w;
  w.tensor("a", 0, {16}, std::vector<uint8_t>(64));
  w.tensor("b", 0, {16}, std::vector<uint8_t>(64));
  auto bytes = w.bytes();
  // The second tensor info's offset (64) is the last 8 bytes before the padding.
  const std::string b_name = "b";
  size_t pos = 0;
  for (size_t i = 0; i + 1 < bytes.size(); ++i)
    if (bytes[i] == 1 && bytes[i + 8] == 'b') pos = i;  // the string length 1 before "b"
  ASSERT_GT(pos, 0u);
  const size_t offset_at = pos + 8 + 1 + 4 + 8 + 4;  // len, name, n_dims, dim, type
  auto b = bytes;
  b[offset_at] = 8;
  expect_error(b, "not a multiple of the alignment");
  b = bytes;
  b[offset_at] = 32;
  expect_error(b, "overlaps");
}

TEST_F(GgufTest, MissingFileIsAnError) {
  EXPECT_THROW(GgufFile::open(dir_ / "absent.gguf"), Error);
}

}  // namespace
}  // namespace edgellm
