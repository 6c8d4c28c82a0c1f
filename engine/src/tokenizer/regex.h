// PCRE2 (UTF + UCP, JIT when available) behind a small value type. HF
// `tokenizers` compiles its patterns with Oniguruma; PCRE2 accepts the same
// syntax for every pattern these tokenizers use (\p{L}, (?i:...), (?!\S)).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edgellm::tok {

class Regex {
 public:
  // Throws Error("<context>: invalid regex '...': <PCRE2 message> at offset N").
  Regex(std::string_view pattern, std::string_view context);
  // A pattern matching `literal` exactly (HF's {"String": ...} patterns).
  static Regex literal(std::string_view literal, std::string_view context);

  // Appends the [begin, end) byte ranges of all non-overlapping, non-empty
  // matches in `subject` (valid UTF-8), left to right.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;
  // Whether the pattern matches anywhere in `subject`.
  bool search(std::string_view subject) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

// Rewrites \s and \S so they also match U+0085 (NEL): Oniguruma's Unicode \s
// is the White_Space property, which includes NEL; PCRE2's does not.
std::string oniguruma_compatible(std::string_view pattern);

}  // namespace edgellm::tok
