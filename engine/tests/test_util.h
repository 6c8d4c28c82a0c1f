// Helpers for engine tests: temp directories and tiny safetensors files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "edgellm/bf16.h"

namespace edgellm::testing {

// A fresh directory under the system temp dir. Every one is removed when the
// test binary exits, so thousands of test runs leave nothing behind.
inline std::filesystem::path make_temp_dir(const std::string& tag) {
  struct Created {
    std::vector<std::filesystem::path> dirs;
    ~Created() {
      std::error_code ignored;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ignored);
    }
  };
  static Created created;
  static std::mt19937_64 rng{std::random_device{}()};
  auto dir =
      std::filesystem::temp_directory_path() / ("edgellm_" + tag + "_" + std::to_string(rng()));
  std::filesystem::create_directories(dir);
  created.dirs.push_back(dir);
  return dir;
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A tokenizer.json of whole pieces (a BPE without merges, Fuse decoder): ids
// 0.. are `pieces`, then `added` ({content, special}) as added tokens.
inline nlohmann::json piece_tokenizer_json(const std::vector<std::string>& pieces,
                                           const std::vector<std::pair<std::string, bool>>& added) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = i;
  nlohmann::json added_tokens = nlohmann::json::array();
  for (size_t i = 0; i < added.size(); ++i)
    added_tokens.push_back({{"id", pieces.size() + i},
                            {"content", added[i].first},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", added[i].second}});
  return {{"version", "1.0"},
          {"added_tokens", added_tokens},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", nlohmann::json::array()}}}};
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

// The header is padded to an odd length, so every tensor starts at an odd
// address, as the format allows: loaders must not assume aligned data (UBSan
// flags a typed load from it).
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
  if (h.size() % 2 == 0) h += ' ';
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.bf16.data()),
              static_cast<std::streamsize>(t.bf16.size() * 2));
}

// Byte-level BPE in the SmolLM2 layout: Digits(individual) then ByteLevel,
// <|im_start|> as bos. The added tokens' ids follow the 24 vocabulary entries,
// as HF assigns them. "Ġ" is the byte-level space; "Ã" "©" are the byte-level
// characters of the two UTF-8 bytes of "é".
inline const char* kBpeJson = R"json({"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [
  {"id": 24, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 25, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
  {"type": "Digits", "individual_digits": true},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
 "post_processor": {"type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
  "pair": [],
  "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [24], "tokens": ["<|im_start|>"]}}},
 "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
  "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "w": 4, "r": 5, "d": 6, "Ġ": 7, "Ã": 8, "©": 9, "1": 10,
   "2": 11, "he": 12, "ll": 13, "hell": 14, "hello": 15, "Ġw": 16, "or": 17, "Ġwor": 18,
   "Ġworld": 19, "12": 20, "ld": 21, ".": 22, "!": 23},
  "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2"]}})json";

}  // namespace edgellm::testing
