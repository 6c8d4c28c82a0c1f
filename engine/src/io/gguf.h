// Memory-mapped GGUF files (llama.cpp's format: metadata key/values, tensor
// infos, aligned tensor data). Every count, offset, type, dimension and string
// length is checked against the file before it is used; a bad file gets one
// Error naming the file and the field. See docs/gguf.md in ggml for the format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace edgellm {

class MappedFile;

// GGML tensor types this reader knows the block size of (ggml.h numbering).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,
};
// "Q4_K", or "type 23" for a number this reader does not know.
std::string ggml_type_name(uint32_t type);

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> dims;  // GGUF order: dims[0] is the innermost (a row's length)
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  uint64_t numel() const;
  uint64_t cols() const { return dims.empty() ? 1 : dims[0]; }
  uint64_t rows() const { return numel() / cols(); }
};

// One metadata value. Scalars are decoded; arrays are located (element type,
// count, file offset) and decoded on request.
struct GgufValue {
  enum class Type : uint32_t {
    u8 = 0,
    i8 = 1,
    u16 = 2,
    i16 = 3,
    u32 = 4,
    i32 = 5,
    f32 = 6,
    boolean = 7,
    string = 8,
    array = 9,
    u64 = 10,
    i64 = 11,
    f64 = 12,
  };
  Type type = Type::u8;
  int64_t i = 0;         // integer types and bool (u64 above INT64_MAX is rejected)
  double f = 0.0;        // f32 / f64
  std::string s;         // string
  Type elem = Type::u8;  // array element type
  uint64_t count = 0;    // array length
  size_t offset = 0;     // array: file offset of the first element
};

class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;  // nullptr when absent

  // Typed metadata lookups: nullopt when the key is absent, an Error when it
  // holds another type.
  std::optional<int64_t> get_int(const std::string& key) const;   // any integer type
  std::optional<double> get_float(const std::string& key) const;  // f32 / f64 (or integer)
  std::optional<std::string> get_string(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;  // empty if absent
  // An array of numbers (any integer or float element type), as doubles: exact for
  // f32 and 32-bit integers (tokenizer.ggml.scores / token_type). Empty if absent.
  std::vector<double> get_number_array(const std::string& key) const;

 private:
  GgufFile();
  const GgufValue* typed(const std::string& key, const char* what,
                         std::initializer_list<GgufValue::Type> types) const;

  std::unique_ptr<MappedFile> file_;
  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
};

}  // namespace edgellm
