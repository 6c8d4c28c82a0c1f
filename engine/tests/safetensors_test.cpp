#include <gtest/gtest.h>

#include "edgellm/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace edgellm {
namespace {

std::filesystem::path write_valid(std::map<std::string, testing::FakeTensor>* out = nullptr) {
  auto dir = testing::make_temp_dir("st");
  std::mt19937 rng(1);
  std::map<std::string, testing::FakeTensor> t;
  t["a"] = testing::random_tensor({3, 5}, 1.0f, rng);
  t["b"] = testing::random_tensor({7}, 1.0f, rng);
  testing::write_safetensors(dir / "model.safetensors", t);
  if (out) *out = t;
  return dir;
}

std::string error_of(const std::filesystem::path& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, ReadsTensors) {
  std::map<std::string, testing::FakeTensor> t;
  auto dir = write_valid(&t);
  Checkpoint c = Checkpoint::open(dir);
  const TensorView* a = c.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a->dtype, DType::bf16);
  EXPECT_EQ(std::memcmp(a->data, t["a"].bf16.data(), 30), 0);
  EXPECT_EQ(c.find("missing"), nullptr);
}

TEST(SafetensorsTest, TruncatedFileIsRejected) {
  auto dir = write_valid();
  const auto path = dir / "model.safetensors";
  const auto size = std::filesystem::file_size(path);
  for (uintmax_t keep : {uintmax_t{0}, uintmax_t{4}, uintmax_t{20}, size - 1}) {
    std::filesystem::resize_file(path, keep);
    EXPECT_NE(error_of(dir).find("model.safetensors"), std::string::npos) << "kept " << keep;
  }
}

TEST(SafetensorsTest, CorruptHeaderIsRejected) {
  auto dir = write_valid();
  const auto path = dir / "model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(12);
  f.put('\x01');  // inside the JSON header
  f.close();
  EXPECT_NE(error_of(dir).find("model.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, OffsetsAndDtypesAreValidated) {
  auto dir = testing::make_temp_dir("st");
  auto write_header = [&](const std::string& h, size_t data_bytes) {
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const uint64_t len = h.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << h << std::string(data_bytes, '\0');
  };
  write_header(R"({"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})", 4);
  EXPECT_NE(error_of(dir).find("outside"), std::string::npos);
  write_header(R"({"x": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 8);
  EXPECT_NE(error_of(dir).find("need"), std::string::npos);
  write_header(R"({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_NE(error_of(dir).find("I64"), std::string::npos);
  write_header(R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_NE(error_of(dir).find("bad dimension"), std::string::npos);
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  EXPECT_NE(error_of(dir).find("header length"), std::string::npos);
}

// Regression: a shape nested 200k deep crashed (stack overflow in dump() for
// the "bad dimension" message); the header parser now refuses deep nesting.
TEST(SafetensorsTest, DeeplyNestedHeaderIsRefused) {
  auto dir = testing::make_temp_dir("st");
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string h =
      R"({"x": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})";
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << std::string(4, '\0');
  out.close();
  const std::string msg = error_of(dir);
  EXPECT_NE(msg.find("nested deeper than"), std::string::npos) << msg;
}

TEST(SafetensorsTest, MissingCheckpointIsNamed) {
  auto dir = testing::make_temp_dir("st");
  EXPECT_NE(error_of(dir).find("no model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace edgellm
