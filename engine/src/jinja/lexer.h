// The template's tokens, as jinja2's lexer makes them: text between tags with
// whitespace control applied ({%- -%}, trim_blocks, lstrip_blocks), comments
// dropped, raw blocks as text, and the tokens inside {{ }} and {% %}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace edgellm::jinja {

enum class Tok {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct Token {
  Tok type;
  std::string text;  // data; name; the unescaped string; the operator; number's digits
  int line;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool ignore_lstrip = false;  // fault injection: lstrip_blocks ignored
};

// Throws TemplateError on a lexical error (unterminated tag, comment, string).
std::vector<Token> tokenize(std::string_view source, const LexOptions& options);

}  // namespace edgellm::jinja
