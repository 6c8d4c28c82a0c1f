// A Jinja2 interpreter for chat templates: parse a model's own template once,
// render it many times with the variables transformers passes
// (apply_chat_template: messages, tools, add_generation_prompt, bos_token, ...).
// The semantics are Python jinja2's in transformers' environment
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
// loopcontrols, its tojson filter, raise_exception and strftime_now, the
// {% generation %} tag), checked byte for byte against it by
// tests/test_jinja_differential.py. A template is untrusted input: its size,
// nesting, steps, work in bytes, live bytes and output are bounded (Limits),
// each checked before the allocation or work it guards, and every failure is a
// TemplateError (a LimitError for a breached limit).
#pragma once

#include <cstddef>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"

namespace edgellm::jinja {

// Any failure to parse or render: a syntax error, a construct we do not
// support (named), an undefined value used, a Python type error, a limit hit.
// `line` is the template line (1-based; 0 when not known).
class TemplateError : public Error {
 public:
  TemplateError(const std::string& message, int line)
      : Error(line > 0 ? "template line " + std::to_string(line) + ": " + message : message),
        line_(line),
        detail_(message) {}
  int line() const { return line_; }
  // The message without the line prefix.
  const std::string& detail() const { return detail_; }

 private:
  int line_;
  std::string detail_;
};

// The template called raise_exception(message): a refusal of the input (e.g.
// "Conversation roles must alternate"), which a server returns as a 400.
class RaisedError : public TemplateError {
 public:
  RaisedError(const std::string& message, int line) : TemplateError(message, line) {}
};

// A limit of Limits breached: the template or its render is refused as a whole.
class LimitError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

// The budget of one template. The corpus (tests/data/chat_templates, the
// largest 17 KB) rendering a 500-turn, 1 MB conversation takes at most 15K
// steps, 33 MB of work and 1.5 MB live: these leave 30-100x that room while a
// hostile template ends in about a second, its RSS growth bounded by
// max_memory plus a few strings of max_output being built (under 256 MB in
// all; tests/test_hostile_templates.py measures each case).
struct Limits {
  // Template text: its nodes take up to ~300x its size ({{1+1+...}} repeated),
  // so 256 KB parses to under 100 MB (the largest real template is 17 KB).
  size_t max_source = size_t{256} << 10;
  size_t max_output = size_t{16} << 20;  // bytes of rendered text, and of any one string
  // Live bytes of the strings, lists, dicts and scopes a render holds (its
  // context included): what a render can pin at once. 40x the real peak.
  size_t max_memory = size_t{64} << 20;
  // Bytes read or written by the render's operations (compare, concatenation,
  // `in`, replace, join, filters, ...): what bounds time where steps do not
  // (one step can compare two 16 MB strings). 30x the real worst; ~0.1-1 s.
  size_t max_work = size_t{1} << 30;
  size_t max_steps = 2'000'000;  // evaluated nodes + loop iterations: ~0.1-0.5 s
  int max_depth = 200;           // parser nesting, macro call depth and value nesting
};

struct Options {
  bool trim_blocks = true;    // transformers' setting: the newline after a block tag goes
  bool lstrip_blocks = true;  // and so does the indentation before one
  Limits limits = {};
  // The clock of strftime_now (UTC when set, for reproducible renders); the
  // local time now when not.
  std::optional<std::time_t> now = std::nullopt;
};

struct Program;  // the parsed template (internal)

class Template {
 public:
  // Parses `source`; throws TemplateError (syntax, unknown filter or test,
  // unsupported tag) naming the line, LimitError past max_source or max_depth.
  static Template parse(std::string_view source, const Options& options = {});
  // Renders with the variables of `context` (a JSON object; key order is kept,
  // as Python dicts keep it). Throws TemplateError / RaisedError, LimitError
  // when the render breaches a limit.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const Program> program_;
  Options options_;
};

// What transformers' apply_chat_template passes to the template.
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // null: no tools (the template sees None)
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // Extra template kwargs (enable_thinking, ...): an object, merged last.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// The context transformers builds from `inputs` (documents=None included).
nlohmann::ordered_json chat_context(const ChatInputs& inputs);

inline std::string render_chat(const Template& t, const ChatInputs& inputs) {
  return t.render(chat_context(inputs));
}

}  // namespace edgellm::jinja
