// Mirrors jinja2/lexer.py's rules (3.1): the root rule finds the earliest tag
// start; "-" strips all whitespace before it, else lstrip_blocks strips the
// indentation of a line that holds only the block or comment tag; a block or
// comment end takes one newline after it with trim_blocks, "-" all whitespace.
#include "jinja/lexer.h"

#include "edgellm/jinja.h"
#include "jinja/pystr.h"

namespace edgellm::jinja {

namespace {

// Python's str.isspace() at s[i] (UTF-8); its byte length, or 0.
size_t space_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return pystr::is_space(c) ? 1 : 0;
  const size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  const std::u32string u = pystr::decode(s.substr(i, len));
  return u.size() == 1 && pystr::is_space(u[0]) ? len : 0;
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    const size_t n = space_at(s, i);
    if (!n) break;
    i += n;
  }
  return i;
}

std::string rstrip(std::string_view s) {
  // Python's rstrip over code points: walk back over whole UTF-8 sequences.
  size_t e = s.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80 && e - b < 4) --b;
    if (space_at(s, b) != e - b) break;
    e = b;
  }
  return std::string(s.substr(0, e));
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  return skip_space(s, 0) == s.size();
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& o) : o_(o) {
    // jinja2: newlines normalized to \n, one trailing newline dropped.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = src_;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s.size()) {
      size_t q = pos;
      while (true) {
        q = s.find('{', q);
        if (q == std::string_view::npos || q + 1 >= s.size()) {
          q = std::string_view::npos;
          break;
        }
        const char k = s[q + 1];
        if (k == '%' || k == '{' || k == '#') break;
        ++q;
      }
      if (q == std::string_view::npos) {
        emit(Tok::data, std::string(s.substr(pos)), pos);
        break;
      }
      const char kind = s[q + 1];
      size_t after = q + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
      size_t raw_end = std::string_view::npos;
      if (kind == '%') raw_end = raw_begin(after);
      std::string text(s.substr(pos, q - pos));
      apply_strip(text, sign, kind != '{', line_starting);
      if (!text.empty()) emit(Tok::data, std::move(text), pos);
      if (raw_end != std::string_view::npos) {
        line_starting = s[raw_end - 1] == '\n';
        pos = raw_body(raw_end, line_starting, line_starting);
        continue;
      }
      if (kind == '#') {
        pos = comment(after, q, line_starting);
        continue;
      }
      emit(kind == '%' ? Tok::block_begin : Tok::var_begin, "", q);
      pos = tag(after, kind == '%', line_starting);
    }
    emit(Tok::eof, "", s.size());
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg, size_t pos) {
    throw TemplateError(msg, line_of(pos));
  }

  int line_of(size_t pos) {
    // Monotone in practice: count forward from the last position asked.
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }

  void emit(Tok t, std::string text, size_t pos) {
    tokens_.push_back({t, std::move(text), line_of(pos)});
  }

  void apply_strip(std::string& text, char sign, bool strippable, bool line_starting) {
    if (sign == '-') {
      text = rstrip(text);
    } else if (sign != '+' && o_.lstrip_blocks && !o_.ignore_lstrip && strippable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && all_space(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
  }

  // {%[-+]? raw %} : the position after it, or npos.
  size_t raw_begin(size_t p) {
    const std::string_view s = src_;
    p = skip_space(s, p);
    if (s.substr(p, 3) != "raw") return std::string_view::npos;
    p = skip_space(s, p + 3);
    if (s.substr(p, 3) == "-%}") return skip_space(s, p + 3);
    if (s.substr(p, 2) == "%}") return p + 2;
    return std::string_view::npos;
  }

  size_t raw_body(size_t start, bool& line_starting, bool begin_line_starting) {
    const std::string_view s = src_;
    for (size_t q = s.find("{%", start); q != std::string_view::npos; q = s.find("{%", q + 1)) {
      size_t p = q + 2;
      char sign = 0;
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      p = skip_space(s, p);
      if (s.substr(p, 6) != "endraw") continue;
      p = skip_space(s, p + 6);
      size_t end;
      if (s.substr(p, 3) == "+%}") {
        end = p + 3;
      } else if (s.substr(p, 3) == "-%}") {
        end = skip_space(s, p + 3);
      } else if (s.substr(p, 2) == "%}") {
        end = p + 2;
        if (o_.trim_blocks && end < s.size() && s[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text(s.substr(start, q - start));
      apply_strip(text, sign, true, begin_line_starting);
      if (!text.empty()) emit(Tok::data, std::move(text), start);
      line_starting = s[end - 1] == '\n';
      return end;
    }
    fail("Missing end of raw directive", start);
  }

  size_t comment(size_t start, size_t tag_pos, bool& line_starting) {
    const std::string_view s = src_;
    const size_t h = s.find("#}", start);
    if (h == std::string_view::npos) fail("Missing end of comment tag", tag_pos);
    size_t end = h + 2;
    if (h > start && s[h - 1] == '-') {
      end = skip_space(s, end);
    } else if (h > start && s[h - 1] == '+') {
    } else if (o_.trim_blocks && end < s.size() && s[end] == '\n') {
      ++end;
    }
    line_starting = s[end - 1] == '\n';
    return end;
  }

  size_t tag(size_t p, bool block, bool& line_starting) {
    const std::string_view s = src_;
    std::vector<char> balance;
    while (true) {
      if (p >= s.size())
        fail(block ? "unexpected end of template, expected 'end of statement block'"
                   : "unexpected end of template, expected 'end of print statement'",
             p);
      if (balance.empty()) {
        size_t end = std::string_view::npos;
        if (block) {
          if (s.substr(p, 3) == "+%}") {
            end = p + 3;
          } else if (s.substr(p, 3) == "-%}") {
            end = skip_space(s, p + 3);
          } else if (s.substr(p, 2) == "%}") {
            end = p + 2;
            if (o_.trim_blocks && end < s.size() && s[end] == '\n') ++end;
          }
        } else {
          if (s.substr(p, 3) == "-}}")
            end = skip_space(s, p + 3);
          else if (s.substr(p, 2) == "}}")
            end = p + 2;
        }
        if (end != std::string_view::npos) {
          emit(block ? Tok::block_end : Tok::var_end, "", p);
          line_starting = s[end - 1] == '\n';
          return end;
        }
      }
      if (const size_t ws = space_at(s, p)) {
        p += ws;
        continue;
      }
      const char c = s[p];
      if (is_digit(c)) {
        p = number(p);
        continue;
      }
      if (is_name_start(c)) {
        size_t e = p + 1;
        while (e < s.size() && is_name_char(s[e])) ++e;
        emit(Tok::name, std::string(s.substr(p, e - p)), p);
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        p = string(p);
        continue;
      }
      static constexpr std::string_view two[] = {"//", "**", "==", "!=", ">=", "<="};
      bool matched = false;
      for (std::string_view op : two)
        if (s.substr(p, 2) == op) {
          emit(Tok::op, std::string(op), p);
          p += 2;
          matched = true;
          break;
        }
      if (matched) continue;
      if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos)
        fail(std::string("unexpected char '") + c + "'", p);
      if (c == '(' || c == '[' || c == '{') {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (c == ')' || c == ']' || c == '}') {
        if (balance.empty()) fail(std::string("unexpected '") + c + "'", p);
        if (balance.back() != c)
          fail(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", p);
        balance.pop_back();
      }
      emit(Tok::op, std::string(1, c), p);
      ++p;
    }
  }

  // (\d+_)*\d+ from p: the end, or p when no digit.
  size_t digits(size_t p) {
    const std::string_view s = src_;
    size_t e = p;
    while (e < s.size() && is_digit(s[e])) {
      ++e;
      if (e + 1 < s.size() && s[e] == '_' && is_digit(s[e + 1])) ++e;
    }
    return e;
  }

  size_t exponent(size_t p) {
    const std::string_view s = src_;
    if (p >= s.size() || (s[p] != 'e' && s[p] != 'E')) return std::string_view::npos;
    size_t q = p + 1;
    if (q < s.size() && (s[q] == '+' || s[q] == '-')) ++q;
    const size_t e = digits(q);
    return e == q ? std::string_view::npos : e;
  }

  size_t number(size_t p) {
    const std::string_view s = src_;
    auto clean = [&](size_t b, size_t e) {
      std::string t;
      for (size_t k = b; k < e; ++k)
        if (s[k] != '_') t += s[k];
      return t;
    };
    if (p == 0 || s[p - 1] != '.') {
      const size_t ip = digits(p);
      size_t fe = std::string_view::npos;
      if (ip < s.size() && s[ip] == '.' && ip + 1 < s.size() && is_digit(s[ip + 1]))
        fe = digits(ip + 1);
      size_t end = std::string_view::npos;
      if (fe != std::string_view::npos) {
        const size_t ee = exponent(fe);
        end = ee != std::string_view::npos ? ee : fe;
      } else {
        end = exponent(ip);
      }
      if (end != std::string_view::npos) {
        emit(Tok::floating, clean(p, end), p);
        return end;
      }
    }
    // integer_re: 0b / 0o / 0x prefixes, [1-9](_?\d)*, 0(_?0)*
    if (s[p] == '0' && p + 1 < s.size()) {
      const char x = static_cast<char>(s[p + 1] | 0x20);
      int base = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 0;
      if (base) {
        auto ok = [&](char ch) {
          ch = static_cast<char>(ch | 0x20);
          return base == 2   ? (ch == '0' || ch == '1')
                 : base == 8 ? (ch >= '0' && ch <= '7')
                             : (is_digit(ch) || (ch >= 'a' && ch <= 'f'));
        };
        size_t e = p + 2;
        while (e < s.size()) {
          if (ok(s[e])) {
            ++e;
          } else if (s[e] == '_' && e + 1 < s.size() && ok(s[e + 1])) {
            e += 2;
          } else {
            break;
          }
        }
        if (e > p + 2) {
          emit(Tok::integer, std::to_string(base) + ":" + clean(p + 2, e), p);
          return e;
        }
      }
    }
    size_t e = p + 1;
    if (s[p] == '0') {
      while (e < s.size() && (s[e] == '0' || (s[e] == '_' && e + 1 < s.size() && s[e + 1] == '0')))
        e += s[e] == '_' ? 2 : 1;
    } else {
      e = digits(p);
    }
    emit(Tok::integer, "10:" + clean(p, e), p);
    return e;
  }

  size_t string(size_t p) {
    const std::string_view s = src_;
    const char quote = s[p];
    size_t e = p + 1;
    while (e < s.size() && s[e] != quote) e += s[e] == '\\' ? 2 : 1;
    if (e >= s.size()) fail("unexpected char '" + std::string(1, quote) + "'", p);
    emit(Tok::string, unescape(s.substr(p + 1, e - p - 1), p), p);
    return e + 1;
  }

  // Python's 'unicode-escape' decoding of a string literal's body.
  std::string unescape(std::string_view b, size_t pos) {
    std::string out;
    out.reserve(b.size());
    auto hex = [&](size_t at, size_t n) -> char32_t {
      if (at + n > b.size()) fail("truncated \\xXX escape", pos);
      char32_t v = 0;
      for (size_t k = at; k < at + n; ++k) {
        const char c = static_cast<char>(b[k] | 0x20);
        if (is_digit(b[k]))
          v = v * 16 + static_cast<char32_t>(b[k] - '0');
        else if (c >= 'a' && c <= 'f')
          v = v * 16 + static_cast<char32_t>(c - 'a' + 10);
        else
          fail("truncated escape in string literal", pos);
      }
      return v;
    };
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i] != '\\' || i + 1 >= b.size()) {
        out += b[i];
        continue;
      }
      const char c = b[++i];
      switch (c) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          pystr::append_utf8(out, hex(i + 1, 2));
          i += 2;
          break;
        case 'u':
          pystr::append_utf8(out, hex(i + 1, 4));
          i += 4;
          break;
        case 'U': {
          const char32_t v = hex(i + 1, 8);
          if (v > 0x10ffff) fail("illegal Unicode character in string literal", pos);
          pystr::append_utf8(out, v);
          i += 8;
          break;
        }
        case 'N':
          fail("\\N{...} escapes are not supported", pos);
        default:
          if (c >= '0' && c <= '7') {
            char32_t v = 0;
            size_t k = i;
            for (; k < b.size() && k < i + 3 && b[k] >= '0' && b[k] <= '7'; ++k)
              v = v * 8 + static_cast<char32_t>(b[k] - '0');
            pystr::append_utf8(out, v);
            i = k - 1;
          } else {
            out += '\\';
            out += c;
          }
      }
    }
    return out;
  }

  LexOptions o_;
  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace edgellm::jinja
