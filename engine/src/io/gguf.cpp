#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "edgellm/error.h"
#include "io/mapped_file.h"

namespace edgellm {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;

struct TypeTraits {
  GgmlType type;
  const char* name;
  uint32_t block;  // elements per block
  uint32_t bytes;  // bytes per block
};

// Block sizes from ggml (ggml.c type_traits); QK_K = 256.
constexpr TypeTraits kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},         {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},     {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},     {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},     {GgmlType::Q8_1, "Q8_1", 32, 36},
    {GgmlType::Q2_K, "Q2_K", 256, 84},    {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},   {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},   {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18}, {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::I8, "I8", 1, 1},           {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},         {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},         {GgmlType::BF16, "BF16", 1, 2},
    {GgmlType::MXFP4, "MXFP4", 32, 17},
};

const TypeTraits* traits(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return &t;
  return nullptr;
}

size_t scalar_size(GgufValue::Type t) {
  using T = GgufValue::Type;
  switch (t) {
    case T::u8:
    case T::i8:
    case T::boolean:
      return 1;
    case T::u16:
    case T::i16:
      return 2;
    case T::u32:
    case T::i32:
    case T::f32:
      return 4;
    case T::u64:
    case T::i64:
    case T::f64:
      return 8;
    case T::string:
    case T::array:
      return 0;
  }
  return 0;
}

// Bounds-checked little-endian reads; every failure names the field.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  void seek(size_t pos) { pos_ = pos; }

  void need(uint64_t n, const std::string& field) const {
    if (n > remaining())
      throw Error(path_ + ": truncated: " + field + " needs " + std::to_string(n) +
                  " bytes at offset " + std::to_string(pos_) + " but the file has " +
                  std::to_string(size_) + " bytes");
  }
  template <typename T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& field) {
    const auto len = read<uint64_t>(field + " (string length)");
    need(len, field + " (string of " + std::to_string(len) + " bytes)");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }
  void skip_string(const std::string& field) {
    const auto len = read<uint64_t>(field + " (string length)");
    need(len, field + " (string of " + std::to_string(len) + " bytes)");
    pos_ += len;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

GgufValue::Type value_type(Cursor& c, const std::string& path, const std::string& field) {
  const auto t = c.read<uint32_t>(field + " type");
  if (t > static_cast<uint32_t>(GgufValue::Type::f64))
    throw Error(path + ": " + field + " has unknown value type " + std::to_string(t));
  return static_cast<GgufValue::Type>(t);
}

GgufValue read_value(Cursor& c, const std::string& path, const std::string& key) {
  using T = GgufValue::Type;
  const std::string field = "metadata '" + key + "'";
  GgufValue v;
  v.type = value_type(c, path, field);
  switch (v.type) {
    case T::u8:
      v.i = c.read<uint8_t>(field);
      break;
    case T::i8:
      v.i = c.read<int8_t>(field);
      break;
    case T::u16:
      v.i = c.read<uint16_t>(field);
      break;
    case T::i16:
      v.i = c.read<int16_t>(field);
      break;
    case T::u32:
      v.i = c.read<uint32_t>(field);
      break;
    case T::i32:
      v.i = c.read<int32_t>(field);
      break;
    case T::i64:
      v.i = c.read<int64_t>(field);
      break;
    case T::u64: {
      const auto u = c.read<uint64_t>(field);
      check(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
            path + ": " + field + " holds " + std::to_string(u) + ", too large");
      v.i = static_cast<int64_t>(u);
      break;
    }
    case T::boolean: {
      const auto b = c.read<uint8_t>(field);
      check(b <= 1, path + ": " + field + " is a bool holding " + std::to_string(b));
      v.i = b;
      break;
    }
    case T::f32:
      v.f = c.read<float>(field);
      break;
    case T::f64:
      v.f = c.read<double>(field);
      break;
    case T::string:
      v.s = c.string(field);
      break;
    case T::array: {
      v.elem = value_type(c, path, field + " element");
      check(v.elem != T::array, path + ": " + field + " is a nested array (not supported)");
      v.count = c.read<uint64_t>(field + " count");
      v.offset = c.pos();
      if (v.elem == T::string) {
        // Each string needs at least its 8-byte length: reject absurd counts
        // before walking them.
        c.need(v.count > c.remaining() / 8 ? c.remaining() + 1 : v.count * 8,
               field + " (" + std::to_string(v.count) + " strings)");
        for (uint64_t i = 0; i < v.count; ++i) c.skip_string(field + "[" + std::to_string(i) + "]");
      } else {
        const size_t sz = scalar_size(v.elem);
        c.need(v.count > c.remaining() / sz ? c.remaining() + 1 : v.count * sz,
               field + " (" + std::to_string(v.count) + " elements)");
        c.seek(c.pos() + v.count * sz);
      }
      break;
    }
  }
  return v;
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeTraits* t = traits(type);
  return t ? t->name : "type " + std::to_string(type);
}

uint64_t GgufTensor::numel() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;  // overflow ruled out when the file was opened
  return n;
}

GgufFile::GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile g;
  g.file_ = std::make_unique<MappedFile>(path);
  g.path_ = g.file_->path();
  const std::string& p = g.path_;
  Cursor c(g.file_->data(), g.file_->size(), p);

  const auto magic = c.read<uint32_t>("magic");
  check(magic == kMagic, p + ": not a GGUF file (bad magic)");
  g.version_ = c.read<uint32_t>("version");
  check(g.version_ == 2 || g.version_ == 3,
        p + ": GGUF version " + std::to_string(g.version_) + " is not supported (2 or 3)");
  const auto n_tensors = c.read<uint64_t>("tensor count");
  const auto n_kv = c.read<uint64_t>("metadata count");
  // A metadata entry takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8.
  check(n_kv <= c.remaining() / 13,
        p + ": metadata count " + std::to_string(n_kv) + " exceeds what the file can hold");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("metadata key #" + std::to_string(i));
    GgufValue v = read_value(c, p, key);
    check(!g.metadata_.count(key), p + ": metadata key '" + key + "' appears twice");
    g.metadata_.emplace(std::move(key), std::move(v));
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto a = g.get_int("general.alignment")) {
    check(*a > 0 && (*a & (*a - 1)) == 0 && *a <= (1 << 20),
          p + ": general.alignment " + std::to_string(*a) + " is not a power of two");
    alignment = static_cast<uint64_t>(*a);
  }

  check(n_tensors <= c.remaining() / 24,
        p + ": tensor count " + std::to_string(n_tensors) + " exceeds what the file can hold");
  struct Info {
    std::string name;
    uint64_t offset, nbytes;
  };
  std::vector<Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor #" + std::to_string(i) + " name");
    const std::string field = "tensor '" + t.name + "'";
    const auto n_dims = c.read<uint32_t>(field + " dimension count");
    check(n_dims >= 1 && n_dims <= kMaxDims,
          p + ": " + field + " has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.read<uint64_t>(field + " dimension " + std::to_string(d));
      check(dim >= 1 && dim <= (uint64_t{1} << 40) && numel <= (uint64_t{1} << 40) / dim,
            p + ": " + field + " dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                " (empty or too large)");
      numel *= dim;
      t.dims.push_back(dim);
    }
    const auto type = c.read<uint32_t>(field + " type");
    const TypeTraits* tt = traits(type);
    check(tt != nullptr, p + ": " + field + " has GGML type " + std::to_string(type) +
                             ", which edgellm does not support");
    t.type = tt->type;
    check(t.dims[0] % tt->block == 0, p + ": " + field + " row length " +
                                          std::to_string(t.dims[0]) + " is not a multiple of " +
                                          tt->name + "'s block of " + std::to_string(tt->block));
    const auto offset = c.read<uint64_t>(field + " data offset");
    check(offset % alignment == 0, p + ": " + field + " data offset " + std::to_string(offset) +
                                       " is not a multiple of the alignment " +
                                       std::to_string(alignment));
    const uint64_t nbytes = numel / tt->block * tt->bytes;
    check(!g.tensors_.count(t.name), p + ": tensor '" + t.name + "' appears twice");
    infos.push_back({t.name, offset, nbytes});
    t.nbytes = nbytes;
    g.tensors_.emplace(t.name, std::move(t));
  }

  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  const uint64_t size = g.file_->size();
  check(data_start <= size, p + ": truncated: tensor data would start at " +
                                std::to_string(data_start) + " but the file has " +
                                std::to_string(size) + " bytes");
  const uint64_t data_size = size - data_start;
  std::sort(infos.begin(), infos.end(),
            [](const Info& a, const Info& b) { return a.offset < b.offset; });
  uint64_t prev_end = 0;
  std::string prev;
  for (const Info& info : infos) {
    check(info.offset <= data_size && info.nbytes <= data_size - info.offset,
          p + ": tensor '" + info.name + "' data [" + std::to_string(info.offset) + ", +" +
              std::to_string(info.nbytes) + ") runs past the end of the file (truncated?)");
    check(info.offset >= prev_end,
          p + ": tensor '" + info.name + "' data overlaps tensor '" + prev + "'");
    prev_end = info.offset + info.nbytes;
    prev = info.name;
    GgufTensor& t = g.tensors_.at(info.name);
    t.data = g.file_->data() + data_start + info.offset;
  }
  return g;
}

const GgufValue* GgufFile::typed(const std::string& key, const char* what,
                                 std::initializer_list<GgufValue::Type> types) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return nullptr;
  check(std::find(types.begin(), types.end(), it->second.type) != types.end(),
        path_ + ": metadata '" + key + "' is not " + what);
  return &it->second;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  using T = GgufValue::Type;
  const GgufValue* v =
      typed(key, "an integer",
            {T::u8, T::i8, T::u16, T::i16, T::u32, T::i32, T::u64, T::i64, T::boolean});
  return v ? std::optional<int64_t>(v->i) : std::nullopt;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  using T = GgufValue::Type;
  const GgufValue* v =
      typed(key, "a number",
            {T::f32, T::f64, T::u8, T::i8, T::u16, T::i16, T::u32, T::i32, T::u64, T::i64});
  if (!v) return std::nullopt;
  return v->type == T::f32 || v->type == T::f64 ? v->f : static_cast<double>(v->i);
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = typed(key, "a string", {GgufValue::Type::string});
  return v ? std::optional<std::string>(v->s) : std::nullopt;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = typed(key, "an array", {GgufValue::Type::array});
  if (!v) return {};
  check(v->elem == GgufValue::Type::string,
        path_ + ": metadata '" + key + "' is not a string array");
  Cursor c(file_->data(), file_->size(), path_);
  c.seek(v->offset);
  std::vector<std::string> out;
  out.reserve(v->count);
  for (uint64_t i = 0; i < v->count; ++i) out.push_back(c.string(key));  // validated at open
  return out;
}

std::vector<double> GgufFile::get_number_array(const std::string& key) const {
  using T = GgufValue::Type;
  const GgufValue* v = typed(key, "an array", {T::array});
  if (!v) return {};
  check(v->elem != T::string, path_ + ": metadata '" + key + "' is not a numeric array");
  Cursor c(file_->data(), file_->size(), path_);
  c.seek(v->offset);
  std::vector<double> out;
  out.reserve(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {  // bounds validated at open
    switch (v->elem) {
      case T::u8:
      case T::boolean:
        out.push_back(c.read<uint8_t>(key));
        break;
      case T::i8:
        out.push_back(c.read<int8_t>(key));
        break;
      case T::u16:
        out.push_back(c.read<uint16_t>(key));
        break;
      case T::i16:
        out.push_back(c.read<int16_t>(key));
        break;
      case T::u32:
        out.push_back(c.read<uint32_t>(key));
        break;
      case T::i32:
        out.push_back(c.read<int32_t>(key));
        break;
      case T::u64:
        out.push_back(static_cast<double>(c.read<uint64_t>(key)));
        break;
      case T::i64:
        out.push_back(static_cast<double>(c.read<int64_t>(key)));
        break;
      case T::f32:
        out.push_back(c.read<float>(key));
        break;
      case T::f64:
        out.push_back(c.read<double>(key));
        break;
      case T::string:
      case T::array:
        break;
    }
  }
  return out;
}

}  // namespace edgellm
