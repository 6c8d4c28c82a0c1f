// A GGUF deployment: the quantized matrices of a .gguf file, run exactly. Two
// layouts: a bare .gguf (open_bare_gguf_weights: every tensor from the file,
// named natively), or the store's, with everything else (config, tokenizer,
// chat template, norms) from the converted checkpoint beside it. scripts/fetch_model.py writes both
// from the same file: <checkpoint>/model.gguf and <checkpoint>/gguf_map.json, which maps each HF
// matrix name to its GGUF tensor and row order. The row order (llama.cpp's Q/K
// permutation, undone) is computed by the converter's own function, so the
// conversion rules live in one place.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "edgellm/config.h"
#include "io/gguf.h"
#include "models/weights.h"

namespace edgellm {

struct GgufWeights {
  GgufFile file;
  QuantSource source;  // points into `file`: keep it alive while loading
  // A bare GGUF: every tensor under its HF name, as load_weights finds them.
  // Views into `file`, or into `owned` where llama.cpp's layout had to be
  // undone; quantized matrices are shapes only (their data is in `source`).
  std::optional<Checkpoint> checkpoint;
  std::vector<std::vector<float>> owned;
};

// Opens the GGUF and its map, checks the map against the file and the GGUF's
// metadata against config.json. Matrices stored as F32/F16/BF16 are left to
// the checkpoint's bf16 copy; any other type without a kernel is an Error
// naming the tensor and the type.
std::unique_ptr<GgufWeights> open_gguf_weights(const std::filesystem::path& gguf_path,
                                               const ModelConfig& config);

// A .gguf with nothing beside it: the HF name of each tensor and llama.cpp's
// edits undone (Llama's Q/K row permutation, Gemma's norm weights stored as
// 1 + w), derived from general.architecture as scripts/fetch_model.py does. A
// tensor this mapping does not know is an Error naming it.
std::unique_ptr<GgufWeights> open_bare_gguf_weights(const std::filesystem::path& gguf_path);

// A quantized tensor's values as the kernels use them (GGUF row order, fp32):
// the repacked layout dequantized, for the tests that hold it to gguf-py.
// max_rows > 0 stops after that many rows.
std::vector<float> dequantize_gguf_tensor(const GgufTensor& t, size_t max_rows = 0);

}  // namespace edgellm
