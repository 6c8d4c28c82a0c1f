// Helpers for engine tests: temp directories and tiny safetensors files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edgellm/bf16.h"

namespace edgellm::testing {

inline std::filesystem::path make_temp_dir(const std::string& tag) {
  static std::mt19937_64 rng{std::random_device{}()};
  auto dir =
      std::filesystem::temp_directory_path() / ("edgellm_" + tag + "_" + std::to_string(rng()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

struct FakeTensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> bf16;
};

// Random bf16 tensor, values ~ U(-scale, scale).
inline FakeTensor random_tensor(std::vector<int64_t> shape, float scale, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> dist(-scale, scale);
  FakeTensor t{std::move(shape), {}};
  t.bf16.resize(static_cast<size_t>(n));
  for (auto& v : t.bf16) v = float_to_bf16(dist(rng));
  return t;
}

inline void write_safetensors(const std::filesystem::path& path,
                              const std::map<std::string, FakeTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const size_t bytes = t.bf16.size() * 2;
    header[name] = {
        {"dtype", "BF16"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.bf16.data()),
              static_cast<std::streamsize>(t.bf16.size() * 2));
}

}  // namespace edgellm::testing
