// UTF-8 helpers shared by the tokenizer pipeline. The tokenizer works on
// UTF-8 bytes throughout (as HF `tokenizers` does on Rust `str`), so these are
// the only places that know how a code point is laid out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace edgellm::tok {

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for a stray
// continuation byte, so loops over invalid text still advance).
inline size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes the code point at s[pos] (s must be valid UTF-8) and advances pos.
uint32_t next_codepoint(std::string_view s, size_t& pos);

void append_utf8(std::string& out, uint32_t cp);

// Byte length of the valid UTF-8 sequence at s[pos], or 0 when the bytes there
// are not one (overlong, surrogate, truncated, out of range).
size_t valid_sequence_len(std::string_view s, size_t pos);

// Replaces every maximal invalid subsequence with U+FFFD, exactly like Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace").
std::string utf8_lossy(std::string_view bytes);

bool is_valid_utf8(std::string_view s);

// Unicode White_Space (Rust char::is_whitespace): what HF strips.
bool is_white_space(uint32_t cp);

// Python's str.isspace() for one code point: what Jinja's `trim` strips.
bool is_python_space(uint32_t cp);

// Python str.strip() with no arguments.
std::string python_strip(std::string_view s);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace edgellm::tok
