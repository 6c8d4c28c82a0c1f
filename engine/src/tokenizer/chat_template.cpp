// The model's chat template: found where transformers looks for it, parsed
// once by the Jinja interpreter, rendered with transformers' inputs. Where each
// message's content lands in the text is found by a second render with the
// contents replaced by markers, so the tokenizer keeps content plain text.
#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "edgellm/error.h"
#include "edgellm/jinja.h"
#include "edgellm/json_file.h"
#include "edgellm/reasoning.h"
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

// A marker no template writes and no filter of trim's kind changes: private-use
// code points around the index of the text it stands for (marked_text).
constexpr std::string_view kMarkerOpen = "\xEE\x80\x80", kMarkerClose = "\xEE\x80\x81";
std::string content_marker(size_t i) {
  return std::string(kMarkerOpen) + std::to_string(i) + std::string(kMarkerClose);
}

// A message as transformers' templates read it (OpenAI's shape): content is
// left out of an assistant turn that only calls tools, as clients send it;
// call arguments are objects, as the templates' `arguments | tojson` expects.
nlohmann::ordered_json message_json(const ChatMessage& m) {
  nlohmann::ordered_json j = {{"role", m.role}};
  if (!m.content.empty() || m.tool_calls.empty()) j["content"] = m.content;
  if (!m.tool_calls.empty()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (const ToolCall& c : m.tool_calls) {
      nlohmann::ordered_json args = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
      if (args.is_discarded()) args = c.arguments;
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
    }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
  return j;
}

// The plain texts a render places, each with its marker's index: message i's
// content is 2i, its reasoning_content 2i + 1.
const std::string& marked_text(std::span<const ChatMessage> messages, size_t index) {
  const ChatMessage& m = messages[index / 2];
  return index % 2 == 0 ? m.content : m.reasoning_content;
}

// The forms a template may give a content: as is, or trimmed on either side.
std::vector<std::string> content_forms(const std::string& c) {
  const std::string stripped = tok::python_strip(c);
  const size_t lead = stripped.empty() ? c.size() : c.find(stripped);
  std::vector<std::string> forms = {c, c.substr(lead), c.substr(0, lead + stripped.size()),
                                    stripped};
  std::sort(forms.begin(), forms.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  forms.erase(std::unique(forms.begin(), forms.end()), forms.end());
  return forms;
}

// Matches `text` against `marked` (the same render with contents as markers):
// the template's own text must agree byte for byte, and each marker must stand
// for one form of its content followed by the next stretch of template text.
// Stops at the first place they part (a template that branches on the
// content), keeping the spans found before it.
void locate_contents(const std::string& text, const std::string& marked,
                     std::span<const ChatMessage> messages, std::vector<TextSpan>& spans) {
  size_t t = 0, m = 0;
  while (true) {
    const size_t open = marked.find(kMarkerOpen, m);
    if (open == std::string::npos) return;
    if (text.compare(t, open - m, marked, m, open - m) != 0) return;
    t += open - m;
    const size_t digits = open + kMarkerOpen.size();
    const size_t close = marked.find(kMarkerClose, digits);
    if (close == std::string::npos) return;
    size_t index = 0;
    for (size_t i = digits; i < close; ++i) {
      if (marked[i] < '0' || marked[i] > '9') return;
      index = index * 10 + static_cast<size_t>(marked[i] - '0');
    }
    if (index >= 2 * messages.size()) return;
    m = close + kMarkerClose.size();
    const size_t next = std::min(marked.find(kMarkerOpen, m), marked.size());
    bool found = false;
    for (const std::string& form : content_forms(marked_text(messages, index))) {
      if (text.compare(t, form.size(), form) != 0 ||
          text.compare(t + form.size(), next - m, marked, m, next - m) != 0)
        continue;
      if (!form.empty()) spans.push_back({t, t + form.size()});
      t += form.size();
      found = true;
      break;
    }
    if (!found) return;
  }
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

  auto special = [&](const char* name) -> std::string {
    const json* t = tok::find_field(config, name);
    if (!t || t->is_null()) return "";
    return t->is_string() ? t->get<std::string>()
                          : tok::string_field(*t, "content", tok::at_key(where, name));
  };
  return from_text(tmpl, special("bos_token"), ct.source_, special("eos_token"));
}

ChatTemplate ChatTemplate::from_text(const std::string& tmpl, const std::string& bos_token,
                                     const std::string& source, const std::string& eos_token) {
  ChatTemplate ct;
  if (tmpl.empty()) return ct;
  ct.source_ = source;
  ct.bos_token_ = bos_token;
  ct.eos_token_ = eos_token;
  try {
    ct.program_ = std::make_shared<const jinja::Template>(jinja::Template::parse(tmpl));
  } catch (const jinja::LimitError& e) {
    throw Error(source + ": chat template: " + e.what());  // beyond its budget: refused at load
  } catch (const jinja::TemplateError& e) {
    ct.parse_error_ = e.what();  // kept: chat requests get it, completions still work
  }
  const auto has = [&](std::string_view s) { return tmpl.find(s) != std::string::npos; };
  ct.name_ = has("<|im_start|>")          ? "chatml"
             : has("<start_of_turn>")     ? "gemma"
             : has("<|start_header_id|>") ? "llama3"
                                          : "jinja";
  if (ct.name_ == "chatml") ct.default_system_ = chatml_default_system(tmpl);
  ct.renders_tools_ = has("tools");
  ct.call_prefix_ = has("<tool_call>")    ? "<tool_call>\n"
                    : has("[TOOL_CALLS]") ? "[TOOL_CALLS]"
                                          : "";
  ct.alternates_ = has("must alternate");
  ct.thinks_ = has(kThinkClose);
  return ct;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 std::vector<TextSpan>* content_spans,
                                 const TemplateInputs& inputs) const {
  if (!available())
    throw Error("chat template: the model has none (no chat_template in tokenizer_config.json)");
  if (!program_) throw Error(source_ + ": the chat template cannot be used: " + parse_error_);
  jinja::ChatInputs in;
  in.tools = inputs.tools;
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = bos_token_;
  in.eos_token = eos_token_;
  in.extra = inputs.kwargs;
  for (const ChatMessage& m : messages) in.messages.push_back(message_json(m));
  try {
    std::string text = jinja::render_chat(*program_, in);
    if (content_spans) {
      // The same inputs with each non-empty content (and reasoning) replaced by its marker.
      for (size_t i = 0; i < messages.size(); ++i) {
        if (!messages[i].content.empty()) in.messages[i]["content"] = content_marker(2 * i);
        if (!messages[i].reasoning_content.empty())
          in.messages[i]["reasoning_content"] = content_marker(2 * i + 1);
      }
      try {
        locate_contents(text, jinja::render_chat(*program_, in), messages, *content_spans);
      } catch (const jinja::TemplateError&) {
        // A template that reads the content itself (parses it, ...): no spans.
      }
    }
    return text;
  } catch (const jinja::RaisedError& e) {
    throw Error("chat template: " + e.detail());  // the template's own words: a 400
  } catch (const jinja::TemplateError& e) {
    throw Error(source_ + ": chat template: " + e.what());
  }
}

std::vector<int32_t> encode_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                         std::span<const ChatMessage> messages,
                                         bool add_generation_prompt, const TemplateInputs& inputs) {
  std::vector<TextSpan> contents;
  const std::string text = chat.render(messages, add_generation_prompt, &contents, inputs);
  return tokenizer.encode(text, /*add_special_tokens=*/false, contents);
}

}  // namespace edgellm
