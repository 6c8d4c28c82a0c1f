// tokenizer.json "post_processor": the special tokens wrapped around a single
// encoded sequence when add_special_tokens is set (HF processors/*.rs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "json_util.h"

namespace edgellm::tok {

struct PostProcessor {
  // Ids before and after the sequence.
  std::vector<int32_t> prefix, suffix;
};

// nullptr for a null post-processor or one that adds nothing (ByteLevel).
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where);

}  // namespace edgellm::tok
