#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include "edgellm/error.h"

namespace edgellm::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
  pcre2_match_data* data;
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
};

// Backslash-escapes PCRE2's metacharacters so a {"String": ...} pattern
// matches itself (Rust's regex::escape). Other bytes, control characters and
// NUL included, are literal in a length-delimited pattern.
std::string escape(std::string_view literal) {
  static constexpr std::string_view kMeta = "\\^$.|?*+()[]{}-#/";
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    if (kMeta.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string oniguruma_compatible(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, std::string_view context) {
  const std::string translated = oniguruma_compatible(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(std::string(context) + ": invalid regex '" + std::string(pattern) + "': " +
                reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(err_offset));
  }
  auto c = std::make_shared<Code>();
  c->code = code;
  // JIT is an optimisation only; interpretation gives the same matches.
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(c);
}

Regex Regex::literal(std::string_view literal, std::string_view context) {
  return Regex(escape(literal), context);
}

void Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const {
  if (subject.empty()) return;
  MatchData md(code_->code);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    // The caller guarantees valid UTF-8, so skip PCRE2's per-call check.
    int rc = PCRE2_ERROR_NOMATCH;
    if (code_->jit)
      rc = pcre2_jit_match(code_->code, s, subject.size(), start, 0, md.data, nullptr);
    if (!code_->jit || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) {
      // The interpreter keeps its backtracking state on the heap, so it also
      // covers the inputs that overflow the JIT stack (long whitespace runs).
      rc = pcre2_match(code_->code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, md.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(std::string("tokenizer: regex match failed: ") +
                  reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one code point so the scan always advances.
      if (b >= subject.size()) break;
      start = b + 1;
      while (start < subject.size() && (static_cast<unsigned char>(subject[start]) & 0xC0) == 0x80)
        ++start;
    }
  }
}

bool Regex::search(std::string_view subject) const {
  MatchData md(code_->code);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()),
                             subject.size(), 0, PCRE2_NO_UTF_CHECK, md.data, nullptr);
  return rc >= 0;
}

}  // namespace edgellm::tok
