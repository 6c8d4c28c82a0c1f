#include "jinja/pystr.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>

#include "jinja/budget.h"
#include "tokenizer/unicode.h"

namespace edgellm::jinja::pystr {

// Every function here charges the bytes it reads and writes to the render's
// work budget (jinja/budget.h): one call can touch a 16 MB string.

std::u32string decode(std::string_view s) {
  check_alloc_size(mul_sat(s.size(), sizeof(char32_t)));  // a transient, of the input's size
  charge_work(mul_sat(s.size(), 1 + sizeof(char32_t)));
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = true;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += cp;
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  tok::append_utf8(out, static_cast<uint32_t>(c));  // the tokenizer's encoder
}

std::string encode(std::u32string_view s) {
  charge_work(mul_sat(s.size(), 1 + sizeof(char32_t)));
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  charge_work(s.size());
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode(s).size();
}

bool is_space(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0a:
    case 0x0b:
    case 0x0c:
    case 0x0d:
    case 0x1c:
    case 0x1d:
    case 0x1e:
    case 0x1f:
    case 0x20:
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

bool is_alpha(char32_t c) {
  return c < 0x80 ? std::isalpha(static_cast<int>(c)) : u_isalpha(c);
}
bool is_digit(char32_t c) {
  return c < 0x80 ? (c >= '0' && c <= '9') : u_isdigit(c);
}
bool is_upper(char32_t c) {
  return u_isupper(c) || u_istitle(c);
}
bool is_lower(char32_t c) {
  return u_islower(c);
}
char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(u_toupper(c));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(u_tolower(c));
}

namespace {

bool cased(char32_t c) {
  return u_hasBinaryProperty(c, UCHAR_CASED);
}

// Full Unicode case mapping of a whole string (ß -> SS), as Python does.
std::string icu_case(std::string_view s, bool up) {
  charge_work(mul_sat(s.size(), 16));  // UTF-16 in, 3x out, UTF-8 back
  UErrorCode err = U_ZERO_ERROR;
  int32_t n16 = 0;
  u_strFromUTF8(nullptr, 0, &n16, s.data(), static_cast<int32_t>(s.size()), &err);
  err = U_ZERO_ERROR;
  std::u16string src(static_cast<size_t>(n16), u'\0');
  u_strFromUTF8WithSub(src.data(), n16, nullptr, s.data(), static_cast<int32_t>(s.size()), 0xFFFD,
                       nullptr, &err);
  std::u16string dst(src.size() * 3 + 4, u'\0');
  err = U_ZERO_ERROR;
  const int32_t n =
      up ? u_strToUpper(dst.data(), static_cast<int32_t>(dst.size()), src.data(), n16, "", &err)
         : u_strToLower(dst.data(), static_cast<int32_t>(dst.size()), src.data(), n16, "", &err);
  if (U_FAILURE(err)) return std::string(s);
  std::string out(static_cast<size_t>(n) * 3 + 4, '\0');
  int32_t n8 = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &n8, dst.data(), n, &err);
  out.resize(static_cast<size_t>(n8));
  return out;
}

}  // namespace

std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  return icu_case(s, true);
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  return icu_case(s, false);
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s);
  std::string out;
  for (size_t k = 0; k < u.size(); ++k)
    append_utf8(out, k == 0 ? static_cast<char32_t>(u_totitle(u[k])) : to_lower(u[k]));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : decode(s)) {
    append_utf8(out, prev_cased ? to_lower(c) : static_cast<char32_t>(u_totitle(c)));
    prev_cased = cased(c);
  }
  return out;
}

std::string swapcase(std::string_view s) {
  std::string out;
  for (char32_t c : decode(s))
    append_utf8(out, u_isupper(c) ? to_lower(c) : u_islower(c) ? to_upper(c) : c);
  return out;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto drop = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit,
                               size_t max_parts) {
  std::vector<std::string> out;
  if (sep) {
    charge_work(search_cost(s.size(), sep->size()));
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t q = s.find(*sep, pos);
      if (q == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, q - pos));
      if (out.size() > max_parts) return out;
      pos = q + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = u.size();
      while (e > i && is_space(u[e - 1])) --e;
      out.push_back(encode(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    if (out.size() > max_parts) return out;
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit,
                                size_t max_parts) {
  std::vector<std::string> out;
  if (sep) {
    charge_work(search_cost(s.size(), sep->size()));
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t q = s.rfind(*sep, end - sep->size());
      if (q == std::string_view::npos) break;
      out.emplace_back(s.substr(q + sep->size(), end - q - sep->size()));
      if (out.size() > max_parts) return out;
      end = q;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string u = decode(s);
  size_t e = u.size();
  while (true) {
    while (e > 0 && is_space(u[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t b = 0;
      while (b < e && is_space(u[b])) ++b;
      out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_space(u[b - 1])) --b;
    out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
    if (out.size() > max_parts) return out;
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_parts) {
  std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size()) {
      const char32_t c = u[j];
      if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
          c == 0x85 || c == 0x2028 || c == 0x2029)
        break;
      ++j;
    }
    size_t eol = j;
    if (j < u.size()) eol = (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n') ? j + 2 : j + 1;
    out.push_back(encode(std::u32string_view(u).substr(i, (keepends ? eol : j) - i)));
    if (out.size() > max_parts) return out;
    i = eol;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count,
                    size_t max_size) {
  charge_work(search_cost(s.size(), old.size()));
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    std::u32string u = decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (k < u.size()) append_utf8(out, u[k]);
      if (out.size() > max_size) return out;
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t q = s.find(old, pos);
    if (q == std::string_view::npos) break;
    out.append(s.substr(pos, q - pos));
    out.append(repl);
    pos = q + old.size();
    ++n;
    if (out.size() > max_size) return out;
  }
  out.append(s.substr(pos));
  return out;
}

namespace {

// Python's slice clamping of [start, end) over n items.
void clamp(int64_t& start, int64_t& end, int64_t n) {
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (end < 0) end = std::max<int64_t>(0, end + n);
  start = std::min(start, n);
  end = std::min(end, n);
}

}  // namespace

int64_t find(std::string_view s, std::string_view sub, int64_t start, int64_t end, bool reverse) {
  std::u32string u = decode(s), v = decode(sub);
  int64_t n = static_cast<int64_t>(u.size());
  clamp(start, end, n);
  if (end - start < static_cast<int64_t>(v.size())) return -1;
  std::u32string_view hay = std::u32string_view(u).substr(start, end - start);
  charge_work(search_cost(hay.size() * sizeof(char32_t), v.size() * sizeof(char32_t)));
  const size_t q = reverse ? hay.rfind(v) : hay.find(v);
  return q == std::u32string_view::npos ? -1 : start + static_cast<int64_t>(q);
}

int64_t count(std::string_view s, std::string_view sub, int64_t start, int64_t end) {
  std::u32string u = decode(s), v = decode(sub);
  int64_t n = static_cast<int64_t>(u.size());
  clamp(start, end, n);
  if (end - start < static_cast<int64_t>(v.size())) return 0;
  if (v.empty()) return end - start + 1;
  std::u32string_view hay = std::u32string_view(u).substr(start, end - start);
  charge_work(search_cost(hay.size() * sizeof(char32_t), v.size() * sizeof(char32_t)));
  int64_t c = 0;
  for (size_t p = hay.find(v); p != std::u32string_view::npos; p = hay.find(v, p + v.size())) ++c;
  return c;
}

}  // namespace edgellm::jinja::pystr
