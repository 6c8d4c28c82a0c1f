// Chat templates rendered natively. transformers renders tokenizer_config.json's
// Jinja template; we recognise which family it is by its markers and produce
// the same string, reading the family's free text (ChatML's default system
// prompt, Llama's knowledge-date line) out of the template itself.
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "edgellm/tokenizer.h"
#include "json_util.h"
#include "unicode.h"

namespace edgellm {

namespace {

using tok::json;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool escaped_at(const std::string& t, size_t i) {
  size_t backslashes = 0;
  while (i > backslashes && t[i - backslashes - 1] == '\\') ++backslashes;
  return backslashes % 2 == 1;
}

// Jinja (Python) string-literal escapes.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
      case '\'':
      case '"':
        out += c;
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

// The unescaped text of the Jinja string literal containing t[pos], from pos
// to its closing quote; nullopt when pos is not inside a literal.
std::optional<std::string> literal_from(const std::string& t, size_t pos) {
  size_t open = pos;
  while (open > 0) {
    --open;
    if ((t[open] == '\'' || t[open] == '"') && !escaped_at(t, open)) break;
    if (open == 0) return std::nullopt;
  }
  const char quote = t[open];
  if (quote != '\'' && quote != '"') return std::nullopt;
  for (size_t close = pos; close < t.size(); ++close) {
    if (t[close] == quote && !escaped_at(t, close))
      return unescape(std::string_view(t).substr(pos, close - pos));
  }
  return std::nullopt;
}

// ChatML templates that add a system turn when the conversation has none
// carry it as one literal: '<|im_start|>system\n<default><|im_end|>\n'.
std::string chatml_default_system(const std::string& t) {
  const std::string marker = "<|im_start|>system";
  for (size_t p = t.find(marker); p != std::string::npos; p = t.find(marker, p + 1)) {
    auto lit = literal_from(t, p);
    if (!lit || !lit->starts_with(marker + "\n")) continue;
    const size_t end = lit->find("<|im_end|>");
    if (end == std::string::npos) continue;  // '... system\n' + messages[0]['content'] + ...
    return lit->substr(marker.size() + 1, end - marker.size() - 1);
  }
  return {};
}

std::string today(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof(buf), format, &tm);
  return std::string(buf, n);
}

// The value of `set <name> = "..."` in the template, if any.
std::string set_literal(const std::string& t, const std::string& name) {
  const std::string key = "set " + name + " = ";
  const size_t p = t.find(key);
  if (p == std::string::npos) return {};
  const size_t q = p + key.size();
  if (q >= t.size() || (t[q] != '"' && t[q] != '\'')) return {};
  return literal_from(t, q + 1).value_or("");
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  ChatTemplate ct;
  std::string tmpl;
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  const std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  json config = json::object();
  if (std::filesystem::exists(config_path)) {
    const std::string text = read_file(config_path);
    config = parse_json(text, config_path.string());
    if (!config.is_object()) throw Error(config_path.string() + ": expected a JSON object");
  }
  const std::string where = config_path.string() + ": ";
  // transformers prefers chat_template.jinja over the config's chat_template.
  if (std::filesystem::exists(jinja_path)) {
    tmpl = read_file(jinja_path);
    ct.source_ = jinja_path.string();
  } else if (const json* t = tok::find_field(config, "chat_template")) {
    ct.source_ = config_path.string();
    if (t->is_string()) {
      tmpl = t->get<std::string>();
    } else if (t->is_array()) {
      // Named templates: transformers uses "default" unless asked for another.
      for (size_t i = 0; i < t->size(); ++i) {
        const std::string w = tok::at_index(tok::at_key(where, "chat_template"), i);
        const std::string name = tok::string_field((*t)[i], "name", w);
        if (name == "default" || tmpl.empty()) tmpl = tok::string_field((*t)[i], "template", w);
        if (name == "default") break;
      }
    } else {
      tok::fail(tok::at_key(where, "chat_template"),
                "expected a string or a list of {name, template}");
    }
  }
  if (tmpl.empty()) return ct;

  std::string bos;
  if (const json* b = tok::find_field(config, "bos_token")) {
    bos = b->is_string() ? b->get<std::string>()
                         : tok::string_field(*b, "content", tok::at_key(where, "bos_token"));
  }
  return from_text(tmpl, bos, ct.source_);
}

ChatTemplate ChatTemplate::from_text(const std::string& tmpl, const std::string& bos_token,
                                     const std::string& source) {
  ChatTemplate ct;
  if (tmpl.empty()) return ct;
  ct.source_ = source;
  ct.bos_token_ = bos_token;
  ct.own_tool_layout_ = tmpl.find("tool") != std::string::npos;
  if (tmpl.find("<|im_start|>") != std::string::npos) {
    ct.style_ = Style::chatml;
    ct.name_ = "chatml";
    ct.default_system_ = chatml_default_system(tmpl);
  } else if (tmpl.find("<start_of_turn>") != std::string::npos) {
    ct.style_ = Style::gemma;
    ct.name_ = "gemma";
    // Gemma 3 folds a system message into the first user turn; Gemma 2 raises.
    ct.system_supported_ = tmpl.find("first_user_prefix") != std::string::npos;
    ct.check_alternation_ = tmpl.find("must alternate") != std::string::npos;
  } else if (tmpl.find("<|start_header_id|>") != std::string::npos) {
    ct.style_ = Style::llama3;
    ct.name_ = "llama3";
    const size_t k = tmpl.find("Cutting Knowledge Date:");
    if (k != std::string::npos) {
      // Llama 3.1+: a system header with these lines is always emitted.
      ct.knowledge_line_ = literal_from(tmpl, k).value_or("");
      const size_t d = tmpl.find("Today Date: ");
      ct.date_prefix_ = d == std::string::npos ? "" : literal_from(tmpl, d).value_or("");
      ct.date_today_ = tmpl.find("strftime_now") != std::string::npos;
      ct.fixed_date_ = set_literal(tmpl, "date_string");
    }
  } else {
    ct.style_ = Style::unrecognised;
    ct.name_ = "unrecognised";
  }
  return ct;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 std::vector<TextSpan>* content_spans) const {
  for (const ChatMessage& m : messages)
    if (!m.tool_calls.empty())
      throw Error(
          "chat template: a message with tool_calls is rendered by encode_conversation "
          "with Tools (edgellm/tool_calls.h)");
  if (own_tool_layout_)
    for (const ChatMessage& m : messages)
      if (m.role == "tool")
        throw Error(source_ +
                    ": this chat template lays out 'tool' messages in its own way, which "
                    "edgellm does not reproduce");
  std::string out;
  auto content = [&](const std::string& text) {
    if (content_spans) content_spans->push_back({out.size(), out.size() + text.size()});
    out += text;
  };
  switch (style_) {
    case Style::none:
      throw Error("chat template: the model has none (no chat_template in tokenizer_config.json)");
    case Style::unrecognised:
      throw Error(source_ +
                  ": chat_template is not one we can render (ChatML, Gemma or Llama 3 expected)");

    case Style::chatml:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && messages[0].role != "system" && !default_system_.empty())
          out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
        out += "<|im_start|>" + messages[i].role + "\n";
        content(messages[i].content);
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;

    case Style::gemma: {
      out = bos_token_;
      size_t first = 0;
      if (!messages.empty() && messages[0].role == "system") {
        if (!system_supported_)
          throw Error(source_ + ": this chat template does not support a system role");
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (check_alternation_ && (m.role == "user") != ((i - first) % 2 == 0))
          throw Error(
              "chat template: conversation roles must alternate user/assistant/user/assistant/...");
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n";
        if (i == first && first > 0) {
          content(messages[0].content);  // the system text, unstripped, as the template does
          out += "\n\n";
        }
        content(tok::python_strip(m.content));
        out += "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }

    case Style::llama3: {
      size_t first = 0;
      if (!knowledge_line_.empty()) {
        std::string system;
        if (!messages.empty() && messages[0].role == "system") {
          system = tok::python_strip(messages[0].content);
          first = 1;
        }
        const std::string date = date_today_ ? today("%d %b %Y") : fixed_date_;
        out = bos_token_ + "<|start_header_id|>system<|end_header_id|>\n\n" + knowledge_line_ +
              date_prefix_ + date + "\n\n";
        content(system);
        out += "<|eot_id|>";
      } else if (!messages.empty()) {
        out = bos_token_;  // Llama 3.0 puts bos in front of the first message only
      }
      for (size_t i = first; i < messages.size(); ++i) {
        out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
        content(tok::python_strip(messages[i].content));
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
  }
  return out;
}

std::vector<int32_t> encode_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                         std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) {
  std::vector<TextSpan> contents;
  const std::string text = chat.render(messages, add_generation_prompt, &contents);
  return tokenizer.encode(text, /*add_special_tokens=*/false, contents);
}

}  // namespace edgellm
