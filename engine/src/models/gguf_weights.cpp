#include "models/gguf_weights.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"

namespace edgellm {

namespace {

std::optional<kernels::BlockFormat> block_format(GgmlType t) {
  using kernels::BlockFormat;
  switch (t) {
    case GgmlType::Q4_0:
      return BlockFormat::q4_0;
    case GgmlType::Q4_1:
      return BlockFormat::q4_1;
    case GgmlType::Q5_0:
      return BlockFormat::q5_0;
    case GgmlType::Q5_1:
      return BlockFormat::q5_1;
    case GgmlType::Q8_0:
      return BlockFormat::q8_0;
    case GgmlType::Q2_K:
      return BlockFormat::q2_k;
    case GgmlType::Q3_K:
      return BlockFormat::q3_k;
    case GgmlType::Q4_K:
      return BlockFormat::q4_k;
    case GgmlType::Q5_K:
      return BlockFormat::q5_k;
    case GgmlType::Q6_K:
      return BlockFormat::q6_k;
    case GgmlType::IQ4_NL:
      return BlockFormat::iq4_nl;
    case GgmlType::IQ4_XS:
      return BlockFormat::iq4_xs;
    default:
      return std::nullopt;
  }
}

bool is_float(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// The GGUF's own hyperparameters must be the ones config.json was written from.
void check_metadata(const GgufFile& g, const ModelConfig& c) {
  const auto arch = g.get_string("general.architecture");
  check(arch.has_value(), g.path() + ": metadata 'general.architecture' is missing");
  auto expect = [&](const std::string& key, int want, bool required) {
    const auto v = g.get_int(*arch + "." + key);
    check(v || !required, g.path() + ": metadata '" + *arch + "." + key + "' is missing");
    check(!v || *v == want, g.path() + ": metadata '" + *arch + "." + key + "' is " +
                                std::to_string(v.value_or(0)) + " but config.json says " +
                                std::to_string(want));
  };
  expect("block_count", c.num_layers, true);
  expect("embedding_length", c.hidden_size, true);
  expect("feed_forward_length", c.intermediate_size, true);
  expect("attention.head_count", c.num_heads, true);
  expect("attention.head_count_kv", c.num_kv_heads, false);
}

kernels::BlockFormat runnable_format(const std::string& file, const GgufTensor& t) {
  const auto format = block_format(t.type);
  check(format.has_value(), file + ": tensor '" + t.name + "' has type " +
                                ggml_type_name(static_cast<uint32_t>(t.type)) +
                                ", which edgellm cannot run (supported: Q4_0, Q4_1, Q5_0, Q5_1, "
                                "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, "
                                "F32)");
  return *format;
}

}  // namespace

std::vector<float> dequantize_gguf_tensor(const GgufTensor& t, size_t max_rows) {
  const size_t rows = max_rows ? std::min<size_t>(max_rows, t.rows()) : t.rows();
  kernels::QuantMatrix m;
  kernels::append_segment(m,
                          kernels::repack_gguf(runnable_format("GGUF", t), t.data, rows, t.cols()));
  std::vector<float> out(rows * t.cols());
  for (size_t r = 0; r < m.rows; ++r) kernels::dequant_row(m, r, out.data() + r * m.cols);
  return out;
}

std::unique_ptr<GgufWeights> open_gguf_weights(const std::filesystem::path& gguf_path,
                                               const ModelConfig& config) {
  auto w = std::make_unique<GgufWeights>(GgufWeights{GgufFile::open(gguf_path), {}});
  const GgufFile& g = w->file;
  check_metadata(g, config);

  const auto map_path = gguf_path.parent_path() / "gguf_map.json";
  check(std::filesystem::exists(map_path),
        map_path.string() + ": missing (scripts/fetch_model.py writes it beside model.gguf)");
  nlohmann::json j;
  try {
    std::ifstream in(map_path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(map_path.string() + ": not valid JSON (" + e.what() + ")");
  }
  const std::string where = map_path.string() + ": ";
  check(j.is_object() && j.contains("tensors") && j["tensors"].is_object(),
        where + "field 'tensors' is missing");
  for (const auto& [hf_name, entry] : j["tensors"].items()) {
    check(entry.is_object() && entry.contains("gguf") && entry["gguf"].is_string(),
          where + "tensors['" + hf_name + "'] needs a string field 'gguf'");
    const std::string name = entry["gguf"].get<std::string>();
    const GgufTensor* t = g.find(name);
    check(t != nullptr, g.path() + ": tensor '" + name + "' (for " + hf_name + ") is missing");
    check(t->dims.size() == 2, g.path() + ": tensor '" + name + "' has " +
                                   std::to_string(t->dims.size()) +
                                   " dimensions, a matrix needs 2");
    if (is_float(t->type)) continue;  // runs from the checkpoint's bf16 copy
    GgufMatrix m{.format = runnable_format(g.path(), *t),
                 .blocks = t->data,
                 .nbytes = t->nbytes,
                 .rows = t->rows(),
                 .cols = t->cols(),
                 .row_order = {}};
    if (entry.contains("row_order")) {
      const auto& order = entry["row_order"];
      check(order.is_array() && order.size() == m.rows, where + "tensors['" + hf_name +
                                                            "'].row_order must list " +
                                                            std::to_string(m.rows) + " rows");
      std::vector<bool> seen(m.rows, false);
      for (const auto& v : order) {
        check(v.is_number_integer() && v.get<int64_t>() >= 0 &&
                  static_cast<uint64_t>(v.get<int64_t>()) < m.rows && !seen[v.get<size_t>()],
              where + "tensors['" + hf_name + "'].row_order is not a permutation of its rows");
        seen[v.get<size_t>()] = true;
        m.row_order.push_back(v.get<int32_t>());
      }
    }
    w->source.gguf.emplace(hf_name, std::move(m));
  }
  const auto* embd = w->source.gguf.find("model.embed_tokens.weight") != w->source.gguf.end()
                         ? &w->source.gguf.at("model.embed_tokens.weight")
                         : nullptr;
  check(!embd || embd->rows == static_cast<size_t>(config.vocab_size),
        g.path() + ": the embedding has " + std::to_string(embd ? embd->rows : 0) +
            " rows but config.json says vocab_size " + std::to_string(config.vocab_size));
  return w;
}

}  // namespace edgellm
