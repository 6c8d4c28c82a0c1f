// The pipeline behind edgellm::Tokenizer, in HF's order: added tokens ->
// normalizer -> pre-tokenizer -> model -> post-processor; decoding goes ids ->
// token strings -> decoder -> (transformers') clean-up.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "added_vocabulary.h"
#include "decoder.h"
#include "edgellm/tokenizer.h"
#include "model.h"
#include "normalizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"

namespace edgellm {

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::Model> model;
  std::unique_ptr<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;
  tok::AddedVocabulary added;
  // transformers' clean_up_tokenization_spaces (tokenizer_config.json).
  bool clean_up_spaces = false;

  // The pipeline a tokenizer.json describes (`root`, its file named `file`),
  // with transformers' changes from tokenizer_config.json (`config`). The GGUF
  // tokenizer (gguf_tokenizer.cpp) describes its pipeline the same way, and
  // passes its (large) model built already instead of root["model"].
  static std::unique_ptr<Impl> build(tok::json root, const tok::json& config,
                                     const std::string& file, const std::string& config_file,
                                     std::unique_ptr<tok::Model> model = nullptr);
  // What transformers' tokenizer class changes on top of tokenizer.json.
  void apply_config(const tok::json& config, const std::string& where);
  // The input split around its added tokens (HF's first stages, before the
  // pre-tokenizer): special tokens are not matched in the `plain` ranges.
  std::vector<tok::Segment> split_added(std::string_view text,
                                        std::span<const TextSpan> plain) const;
  // The token string HF's decoder sees for `id`, or nullptr for unknown ids.
  const std::string* id_to_token(int32_t id) const;
  // tokenizers' Tokenizer::decode, without transformers' clean-up. `kept`:
  // special tokens decoded even when skip_special skips the others.
  std::string decode_raw(std::span<const int32_t> ids, bool skip_special, bool keep_bytes = false,
                         std::span<const std::string> kept = {}) const;
};

}  // namespace edgellm
