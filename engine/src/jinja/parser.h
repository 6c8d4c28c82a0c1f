// Tokens to statements (jinja2/parser.py's grammar). Throws TemplateError.
#pragma once

#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace edgellm::jinja {

Body parse(std::vector<Token> tokens, int max_depth);

}  // namespace edgellm::jinja
