// Python str semantics over UTF-8 text: lengths and indices count code points,
// whitespace is str.isspace(), case mapping is Unicode's (ICU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace edgellm::jinja::pystr {

std::u32string decode(std::string_view s);  // invalid bytes decode as U+FFFD
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // code points

bool is_space(char32_t c);      // str.isspace()
bool is_printable(char32_t c);  // str.isprintable()
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);
std::string title(std::string_view s);  // str.title()
std::string swapcase(std::string_view s);

// strip(chars): `chars` null = whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// The split functions stop at max_parts + 1 parts (the caller refuses that many).
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit,
                               size_t max_parts = SIZE_MAX);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit,
                                size_t max_parts = SIZE_MAX);
std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_parts = SIZE_MAX);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count,
                    size_t max_size);
// Code-point index of the first (last) occurrence of `sub` in s[start:end], or -1.
int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end);

}  // namespace edgellm::jinja::pystr
