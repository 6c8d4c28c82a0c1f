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
      nlohmann::ordered_json args;
      try {  // the bounded, linear parse: arguments come from the request
        args = parse_ordered_json(c.arguments, "arguments");
      } catch (const Error&) {
        args = c.arguments;  // not JSON: the template gets the string
      }
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

// The marker render cut into the template's own text and the markers between.
struct Piece {
  static constexpr size_t kLiteral = static_cast<size_t>(-1);
  std::string_view literal;  // the template's own text (when index is kLiteral)
  size_t index = kLiteral;   // a marker: the index of the text it stands for
};

std::vector<Piece> marker_pieces(std::string_view marked, size_t marker_count) {
  std::vector<Piece> pieces;
  size_t from = 0, search = 0;
  while (true) {
    const size_t open = marked.find(kMarkerOpen, search);
    if (open == std::string_view::npos) break;
    const size_t digits = open + kMarkerOpen.size();
    const size_t close = marked.find(kMarkerClose, digits);
    size_t index = 0;
    bool valid = close != std::string_view::npos && close > digits && close - digits < 8;
    for (size_t i = digits; valid && i < close; ++i) {
      valid = marked[i] >= '0' && marked[i] <= '9';
      index = index * 10 + static_cast<size_t>(marked[i] - '0');
    }
    search = digits;
    if (!valid || index >= marker_count) continue;  // not a marker the render placed
    pieces.push_back({marked.substr(from, open - from)});
    pieces.push_back({{}, index});
    from = search = close + kMarkerClose.size();
  }
  pieces.push_back({marked.substr(from)});
  return pieces;
}

size_t common_prefix(std::string_view a, std::string_view b) {
  return static_cast<size_t>(
      std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first -
      a.begin());
}

size_t common_suffix(std::string_view a, std::string_view b) {
  return static_cast<size_t>(
      std::mismatch(a.rbegin(), a.rbegin() + std::min(a.size(), b.size()), b.rbegin()).first -
      a.rbegin());
}

// The byte ranges of `text` (the real render) to read as plain text, from its
// alignment with `marked` (the same render with every content as a marker).
// The invariant: text outside them is proven to be the template's own text,
// equal byte for byte to the marker render's at the same place. The walk goes
// forward from the start and backward from the end: the template's text must
// agree exactly, and a marker stands for one form of its content only when the
// template's text beside it agrees too. Where the two renders part (a template
// that rewrites a content: Qwen3 splits reasoning off at </think>), everything
// between the two walks is plain, so no content is ever read as special tokens.
std::vector<TextSpan> align_plain_spans(std::string_view text, std::string_view marked,
                                        std::span<const ChatMessage> messages) {
  const std::vector<Piece> pieces = marker_pieces(marked, 2 * messages.size());
  const auto literal_at = [&](size_t p) {
    return p < pieces.size() && pieces[p].index == Piece::kLiteral ? pieces[p].literal
                                                                   : std::string_view();
  };
  std::vector<TextSpan> spans;
  size_t t = 0, p = 0;
  for (; p < pieces.size(); ++p) {
    if (pieces[p].index == Piece::kLiteral) {
      const size_t same = common_prefix(text.substr(t), pieces[p].literal);
      t += same;
      if (same < pieces[p].literal.size()) break;
      continue;
    }
    const std::string_view next = literal_at(p + 1);
    bool found = false;
    for (const std::string& form : content_forms(marked_text(messages, pieces[p].index))) {
      if (text.substr(t, form.size()) != form || text.substr(t + form.size(), next.size()) != next)
        continue;
      if (!form.empty()) spans.push_back({t, t + form.size()});
      t += form.size();
      found = true;
      break;
    }
    if (!found) break;
  }
  size_t e = text.size();
  for (size_t q = pieces.size(); q > p;) {
    --q;
    if (pieces[q].index == Piece::kLiteral) {
      const size_t same = common_suffix(text.substr(t, e - t), pieces[q].literal);
      e -= same;
      if (same < pieces[q].literal.size() || q == p) break;
      continue;
    }
    if (q == p) break;  // the marker the forward walk could not place
    const std::string_view before = literal_at(q - 1);
    bool found = false;
    for (const std::string& form : content_forms(marked_text(messages, pieces[q].index))) {
      if (e < t + before.size() + form.size() ||
          text.substr(e - form.size(), form.size()) != form ||
          text.substr(e - form.size() - before.size(), before.size()) != before)
        continue;
      if (!form.empty()) spans.push_back({e - form.size(), e});
      e -= form.size();
      found = true;
      break;
    }
    if (!found) break;
  }
  if (t < e) spans.push_back({t, e});  // what neither walk proved
  return spans;
}

// The marker render with each marker replaced by the text it stands for: the
// render a template that never rewrites a content would give.
std::string with_contents(std::string_view marked, std::span<const ChatMessage> messages) {
  std::string out;
  for (const Piece& piece : marker_pieces(marked, 2 * messages.size()))
    out += piece.index == Piece::kLiteral ? std::string(piece.literal)
                                          : marked_text(messages, piece.index);
  return out;
}

// Strings of the request the template reads besides the contents (tool calls,
// names, ids, the tools, chat_template_kwargs) are not located in the text, so
// they may hold no special-token text: refused, naming where.
void refuse_special_text(const Tokenizer& tokenizer, const nlohmann::ordered_json& value,
                         const std::string& where) {
  std::vector<const nlohmann::ordered_json*> stack = {&value};
  const auto check = [&](const std::string& s) {
    const std::vector<int32_t> found = tokenizer.special_tokens_in(s);
    if (!found.empty())
      throw Error("chat template: " + where + " holds the special token \"" +
                  tokenizer.decode(std::span(found.data(), 1)) +
                  "\": only message contents may (they are read as plain text)");
  };
  while (!stack.empty()) {  // iterative: a request's JSON may nest deeply
    const nlohmann::ordered_json& v = *stack.back();
    stack.pop_back();
    if (v.is_string()) check(v.get_ref<const std::string&>());
    if (v.is_object())
      for (const auto& [key, item] : v.items()) {
        check(key);
        stack.push_back(&item);
      }
    if (v.is_array())
      for (const auto& item : v) stack.push_back(&item);
  }
}

std::string token_counts(const Tokenizer& tokenizer, std::span<const int32_t> a,
                         std::span<const int32_t> b, const char* a_name, const char* b_name) {
  const size_t at = static_cast<size_t>(
      std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first -
      a.begin());
  const int32_t id = at < a.size() ? a[at] : b[at];
  const auto count = [&](std::span<const int32_t> s) {
    return std::to_string(std::count(s.begin(), s.end(), id));
  };
  const std::string counts = count(a) + " " + a_name + ", " + count(b) + " " + b_name;
  return "\"" + tokenizer.decode(std::span(&id, 1)) +
         "\": " + (count(a) == count(b) ? "in another order, " : "") + counts;
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
  ct.harmony_ = has("<|channel|>");
  return ct;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                 std::vector<TextSpan>* plain_spans, const TemplateInputs& inputs,
                                 std::string* template_text) const {
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
    if (plain_spans || template_text) {
      // The same inputs with each non-empty content (and reasoning) replaced by its marker.
      for (size_t i = 0; i < messages.size(); ++i) {
        if (!messages[i].content.empty()) in.messages[i]["content"] = content_marker(2 * i);
        if (!messages[i].reasoning_content.empty())
          in.messages[i]["reasoning_content"] = content_marker(2 * i + 1);
      }
      std::string marked;
      try {
        marked = jinja::render_chat(*program_, in);
      } catch (const jinja::TemplateError& e) {
        // A template that reads the content itself (parses it, ...): nothing can be proven.
        throw Error(source_ + ": chat template: it fails when message contents are replaced by " +
                    "markers (" + e.what() + "), so message text cannot be kept plain");
      }
      if (plain_spans) *plain_spans = align_plain_spans(text, marked, messages);
      if (template_text) *template_text = std::move(marked);
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
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::ordered_json message = message_json(messages[i]);
    for (const auto& [key, value] : message.items())
      if (key != "content" && key != "reasoning_content")
        refuse_special_text(tokenizer, value, "messages[" + std::to_string(i) + "]." + key);
  }
  refuse_special_text(tokenizer, inputs.tools, "tools");
  refuse_special_text(tokenizer, inputs.kwargs, "chat_template_kwargs");
  std::vector<TextSpan> plain;
  std::string marked;
  const std::string text = chat.render(messages, add_generation_prompt, &plain, inputs, &marked);
  std::vector<int32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/false, plain);
  // Fail closed. The encoding's special tokens are exactly the template's own
  // (those of the marker render), in order; and the real render's special-token
  // text is the template's plus the contents' where the marker render places
  // them, so a template that rewrote a content (dropping or moving its text)
  // cannot have led the alignment to take content for template text.
  std::vector<int32_t> got;
  for (const int32_t id : ids)
    if (tokenizer.is_special(id)) got.push_back(id);
  const std::vector<int32_t> own = tokenizer.special_tokens_in(marked);
  const std::vector<int32_t> rendered = tokenizer.special_tokens_in(text);
  const std::vector<int32_t> expected =
      tokenizer.special_tokens_in(with_contents(marked, messages));
  std::string why;
  if (got != own)
    why = token_counts(tokenizer, got, own, "in the prompt", "written by the template");
  else if (rendered != expected)
    why = token_counts(tokenizer, rendered, expected, "in the rendered text",
                       "in the template's text and the messages");
  if (!why.empty())
    throw Error(
        "chat template: the template rewrites message text, so special tokens cannot be "
        "kept to its own (" +
        why + "); refused so that message text is never read as control tokens");
  return ids;
}

}  // namespace edgellm
