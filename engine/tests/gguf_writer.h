// Writes small GGUF files for the reader's tests and the fuzz corpus.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace edgellm::testing {

class GgufWriter {
 public:
  void kv_u32(const std::string& key, uint32_t v) { kv(key, 4, &v, 4); }
  void kv_f32(const std::string& key, float v) { kv(key, 6, &v, 4); }
  void kv_str(const std::string& key, const std::string& v) {
    key_type(key, 8);
    str(meta_, v);
    ++n_kv_;
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    key_type(key, 9);
    pod(meta_, uint32_t{8});
    pod(meta_, uint64_t{v.size()});
    for (const auto& s : v) str(meta_, s);
    ++n_kv_;
  }
  void kv_bool(const std::string& key, bool v) {
    const uint8_t b = v;
    kv(key, 7, &b, 1);
  }
  void kv_f32_array(const std::string& key, const std::vector<float>& v) { array(key, 6, v); }
  void kv_i32_array(const std::string& key, const std::vector<int32_t>& v) { array(key, 5, v); }
  // A tensor of `type` with dims innermost first and raw block bytes.
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims,
              const std::vector<uint8_t>& bytes) {
    str(infos_, name);
    pod(infos_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) pod(infos_, d);
    pod(infos_, type);
    while (data_.size() % 32) data_.push_back(0);
    pod(infos_, uint64_t{data_.size()});
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    ++n_tensors_;
  }
  std::vector<uint8_t> bytes(uint32_t version = 3) const {
    std::vector<uint8_t> out;
    pod(out, uint32_t{0x46554747});
    pod(out, version);
    pod(out, n_tensors_);
    pod(out, n_kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    while (out.size() % 32) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

  template <typename T>
  static void pod(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void str(std::vector<uint8_t>& out, const std::string& s) {
    pod(out, uint64_t{s.size()});
    out.insert(out.end(), s.begin(), s.end());
  }

 private:
  void key_type(const std::string& key, uint32_t type) {
    str(meta_, key);
    pod(meta_, type);
  }
  template <typename T>
  void array(const std::string& key, uint32_t elem_type, const std::vector<T>& v) {
    key_type(key, 9);
    pod(meta_, elem_type);
    pod(meta_, uint64_t{v.size()});
    for (const T& x : v) pod(meta_, x);
    ++n_kv_;
  }
  void kv(const std::string& key, uint32_t type, const void* v, size_t n) {
    key_type(key, type);
    const auto* p = static_cast<const uint8_t*>(v);
    meta_.insert(meta_.end(), p, p + n);
    ++n_kv_;
  }
  std::vector<uint8_t> meta_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

}  // namespace edgellm::testing
