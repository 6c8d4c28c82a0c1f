// GPT-2's reversible byte <-> printable-character mapping, used by the
// ByteLevel pre-tokenizer, normalizer and decoder: every byte becomes one
// visible code point so BPE never sees raw control bytes or spaces.
#pragma once

#include <string>
#include <string_view>

namespace edgellm::tok {

// Appends the byte-level characters of each byte of `bytes`.
void bytes_to_chars(std::string_view bytes, std::string& out);

// The byte a byte-level code point stands for, or -1 for any other code point.
int char_to_byte(uint32_t codepoint);

// The GPT-2 split pattern the ByteLevel pre-tokenizer uses when use_regex=true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace edgellm::tok
