// The public face of the interpreter (edgellm/jinja.h): parse once, render
// many times, each render with its own evaluator state.
#include <utility>

#include "edgellm/jinja.h"
#include "jinja/fault_injection.h"
#include "jinja/interp.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace edgellm::jinja {

Template Template::parse(std::string_view source, const Options& options) {
  // Nodes cost ~100x the text they come from: the size is the parse's budget.
  if (source.size() > options.limits.max_source)
    throw LimitError("the template's " + std::to_string(source.size()) + " bytes exceed the " +
                         std::to_string(options.limits.max_source) + "-byte source budget",
                     0);
  LexOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  lex.ignore_lstrip = fault::active() == fault::Fault::ignore_lstrip_blocks;
  auto program = std::make_shared<Program>();
  program->body = jinja::parse(tokenize(source, lex), options.limits.max_depth);
  Template t;
  t.program_ = std::move(program);
  t.options_ = options;
  return t;
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  Interp in(options_);
  return in.render(program_->body, context);
}

nlohmann::ordered_json chat_context(const ChatInputs& inputs) {
  // transformers' render_jinja_template: messages, tools, documents,
  // add_generation_prompt, then the special tokens and the caller's kwargs.
  nlohmann::ordered_json c = nlohmann::ordered_json::object();
  c["messages"] = inputs.messages;
  c["tools"] = inputs.tools;
  c["documents"] = nullptr;
  c["add_generation_prompt"] = inputs.add_generation_prompt;
  c["bos_token"] = inputs.bos_token;
  c["eos_token"] = inputs.eos_token;
  if (inputs.extra.is_object())
    for (const auto& [k, v] : inputs.extra.items()) c[k] = v;
  return c;
}

}  // namespace edgellm::jinja
