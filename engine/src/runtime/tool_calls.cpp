// Tool calling (see edgellm/tool_calls.h): request fields, prompt rendering,
// the forced-call schema and the reply parser.
#include "edgellm/tool_calls.h"

#include <cctype>
#include <random>

namespace edgellm {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;  // request fields whose order the prompt keeps

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ToolRequestError(param, message);
}

template <typename J>
const J* field(const J& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

template <typename J>
std::string string_field(const J& obj, const char* name, const std::string& where) {
  const J* v = field(obj, name);
  if (!v) bad(where + "." + name, "missing " + where + "." + name);
  if (!v->is_string() || v->template get<std::string>().empty())
    bad(where + "." + name, where + "." + name + " must be a non-empty string");
  return v->template get<std::string>();
}

// OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

ToolFunction parse_tool(const ojson& tool, const std::string& where) {
  if (!tool.is_object()) bad(where, where + " must be an object");
  const ojson* type = field(tool, "type");
  if (!type || !type->is_string())
    bad(where + ".type", "missing " + where + ".type (only \"function\" is supported)");
  if (*type != "function")
    bad(where + ".type",
        where + ".type '" + type->get<std::string>() + "' is not supported (only \"function\")");
  for (const auto& [name, value] : tool.items())
    if (name != "type" && name != "function" && !value.is_null())
      bad(where + "." + name, "unsupported field '" + where + "." + name + "'");
  const std::string fw = where + ".function";
  const ojson* fn = field(tool, "function");
  if (!fn) bad(fw, "missing " + fw);
  if (!fn->is_object()) bad(fw, fw + " must be an object");
  ToolFunction f;
  f.name = string_field(*fn, "name", fw);
  if (!valid_name(f.name))
    bad(fw + ".name",
        fw + ".name '" + f.name + "' must be 1-64 letters, digits, underscores or dashes");
  for (const auto& [name, value] : fn->items()) {
    if (value.is_null()) continue;
    if (name == "description") {
      if (!value.is_string()) bad(fw + ".description", fw + ".description must be a string");
      f.description = value.get<std::string>();
    } else if (name == "parameters") {
      if (!value.is_object())
        bad(fw + ".parameters", fw + ".parameters must be a JSON schema object");
      f.parameters = value;
    } else if (name == "strict") {
      if (!value.is_boolean()) bad(fw + ".strict", fw + ".strict must be a boolean");
    } else if (name != "name") {
      bad(fw + "." + name, "unsupported field '" + fw + "." + name + "'");
    }
  }
  return f;
}

std::string random_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

std::string trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// The signatures as the system turn lists them, one JSON line per tool.
std::string tool_block(const Tools& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolFunction& f : tools.functions) {
    ojson fn = {{"name", f.name}};
    if (!f.description.empty()) fn["description"] = f.description;
    fn["parameters"] = f.parameters;
    out += '\n';
    out += ojson{{"type", "function"}, {"function", fn}}.dump();
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
  return out;
}

std::string call_text(const ToolCall& c) {
  ojson args = ojson::parse(c.arguments, nullptr, false);
  if (args.is_discarded()) args = c.arguments;  // checked when parsed; kept as text otherwise
  return "<tool_call>\n" + ojson{{"name", c.name}, {"arguments", args}}.dump() + "\n</tool_call>";
}

// One call object of the model's output, or false.
bool read_call(const json& j, const Tools& tools, ToolCall& call) {
  if (!j.is_object()) return false;
  const json* name = field(j, "name");
  if (!name || !name->is_string() || !tools.find(name->get<std::string>())) return false;
  const json* args = field(j, "arguments");
  if (!args) args = field(j, "parameters");
  json value = args ? *args : json::object();
  if (value.is_string()) value = json::parse(value.get<std::string>(), nullptr, false);
  if (!value.is_object()) return false;
  call = {random_call_id(), name->get<std::string>(), value.dump()};
  return true;
}

// A JSON text that is one call or a list of calls; false when it is anything else.
bool read_calls(std::string_view text, const Tools& tools, std::vector<ToolCall>& calls) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return false;
  const json list = j.is_array() ? j : json::array({j});
  if (list.empty()) return false;
  for (const json& item : list) {
    ToolCall c;
    if (!read_call(item, tools, c)) return false;
    calls.push_back(std::move(c));
  }
  return true;
}

}  // namespace

const ToolFunction* Tools::find(std::string_view name) const {
  for (const ToolFunction& f : functions)
    if (f.name == name) return &f;
  return nullptr;
}

Tools parse_tools(const ojson& tools, const ojson& tool_choice, const ojson& parallel_tool_calls) {
  Tools t;
  if (!tools.is_null()) {
    if (!tools.is_array())
      bad("tools", "'tools' must be an array of {\"type\": \"function\", ...}");
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string where = "tools[" + std::to_string(i) + "]";
      ToolFunction f = parse_tool(tools[i], where);
      if (t.find(f.name))
        bad(where + ".function.name", "function '" + f.name + "' is declared twice in 'tools'");
      t.functions.push_back(std::move(f));
    }
  }
  if (!parallel_tool_calls.is_null()) {
    if (!parallel_tool_calls.is_boolean())
      bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    t.parallel = parallel_tool_calls.get<bool>();
  }
  if (tool_choice.is_null()) {
    t.choice = t.functions.empty() ? Tools::Choice::none : Tools::Choice::automatic;
    return t;
  }
  if (tool_choice.is_string()) {
    const std::string c = tool_choice.get<std::string>();
    if (c == "none") {
      t.choice = Tools::Choice::none;
    } else if (c == "auto") {
      t.choice = t.functions.empty() ? Tools::Choice::none : Tools::Choice::automatic;
    } else if (c == "required") {
      if (t.functions.empty())
        bad("tool_choice", "'tool_choice' \"required\" needs at least one function in 'tools'");
      t.choice = Tools::Choice::required;
    } else {
      bad("tool_choice",
          "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
          "\"function\": {\"name\": ...}}");
    }
    return t;
  }
  if (!tool_choice.is_object())
    bad("tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", ...}");
  const ojson* type = field(tool_choice, "type");
  if (!type || *type != "function")
    bad("tool_choice.type", "'tool_choice.type' must be \"function\"");
  const ojson* fn = field(tool_choice, "function");
  if (!fn || !fn->is_object())
    bad("tool_choice.function", "'tool_choice.function' must be an object with a name");
  const std::string name = string_field(*fn, "name", "tool_choice.function");
  if (!t.find(name))
    bad("tool_choice.function.name",
        "'tool_choice' names function '" + name + "', which is not in 'tools'");
  t.choice = Tools::Choice::function;
  t.forced_name = name;
  return t;
}

std::vector<ToolCall> parse_tool_calls(const json& tool_calls, const std::string& where) {
  if (!tool_calls.is_array() || tool_calls.empty())
    bad(where, where + " must be a non-empty array of function calls");
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const json& c = tool_calls[i];
    if (!c.is_object()) bad(w, w + " must be an object");
    const json* type = field(c, "type");
    if (type && *type != "function")
      bad(w + ".type", w + ".type must be \"function\" (the only type supported)");
    ToolCall call;
    call.id = string_field(c, "id", w);
    const json* fn = field(c, "function");
    if (!fn || !fn->is_object()) bad(w + ".function", "missing " + w + ".function");
    call.name = string_field(*fn, "name", w + ".function");
    const json* args = field(*fn, "arguments");
    if (!args) bad(w + ".function.arguments", "missing " + w + ".function.arguments");
    const json parsed =
        args->is_string() ? json::parse(args->get<std::string>(), nullptr, false) : *args;
    if (!parsed.is_object())
      bad(w + ".function.arguments", w + ".function.arguments must be a JSON object");
    call.arguments = args->is_string() ? args->get<std::string>() : args->dump();
    calls.push_back(std::move(call));
  }
  return calls;
}

namespace {

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or an array of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(where, where + ": only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string optional_string(const json& m, const char* name, const std::string& where) {
  const json* v = field(m, name);
  if (!v) return {};
  if (!v->is_string()) bad(where + "." + name, where + "." + name + " must be a string");
  return v->get<std::string>();
}

}  // namespace

std::vector<ChatMessage> parse_chat_messages(const json& messages) {
  if (!messages.is_array() || messages.empty())
    bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> chat;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad(where, where + " must be an object");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) bad(where + ".role", where + ".role must be a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(where + ".role", where + ".role must be system, developer, user, assistant or tool");
    if (const json* tc = field(m, "tool_calls")) {
      if (msg.role != "assistant")
        bad(where + ".tool_calls", where + ".tool_calls is only allowed on assistant messages");
      msg.tool_calls = parse_tool_calls(*tc, where + ".tool_calls");
    }
    const json* content = field(m, "content");
    if (!content && msg.tool_calls.empty())
      bad(where + ".content", "missing " + where + ".content");
    if (content) msg.content = content_text(*content, where + ".content");
    msg.tool_call_id = optional_string(m, "tool_call_id", where);
    msg.name = optional_string(m, "name", where);
    msg.reasoning_content = optional_string(m, "reasoning_content", where);
    if (!msg.reasoning_content.empty() && msg.role != "assistant")
      bad(where + ".reasoning_content",
          where + ".reasoning_content is only allowed on assistant messages");
    chat.push_back(std::move(msg));
  }
  return chat;
}

ojson call_schema(const Tools& tools) {
  ojson any = ojson::array();
  for (const ToolFunction& f : tools.functions) {
    if (tools.choice == Tools::Choice::function && f.name != tools.forced_name) continue;
    // The parameters are a schema document of their own: an $id makes them a
    // resource root, so their "#..." references resolve inside them, not in
    // this wrapper. (References by URI are refused, so replacing theirs loses nothing.)
    ojson arguments = f.parameters;
    arguments["$id"] = "urn:edgellm:tool:" + f.name;
    any.push_back({{"type", "object"},
                   {"properties", {{"name", {{"const", f.name}}}, {"arguments", arguments}}},
                   {"required", {"name", "arguments"}},
                   {"additionalProperties", false}});
  }
  return any.size() == 1 ? any[0] : ojson{{"anyOf", any}};
}

std::shared_ptr<const JsonGrammar> call_grammar(const Tools& tools) {
  try {
    return compile_json_schema(call_schema(tools).dump());
  } catch (const JsonSchemaError& e) {
    std::string param = "tools";
    for (size_t i = 0; i < tools.functions.size(); ++i) {
      try {
        compile_json_schema(tools.functions[i].parameters.dump());
      } catch (const JsonSchemaError&) {
        param = "tools[" + std::to_string(i) + "].function.parameters";
        break;
      }
    }
    bad(param,
        "a forced call is constrained to the function's parameters, and structured "
        "output cannot enforce them: " +
            std::string(e.what()));
  }
}

std::vector<ChatMessage> tool_conversation(const ChatTemplate& chat,
                                           std::span<const ChatMessage> messages,
                                           const Tools& tools) {
  if (chat.renders_tools()) return {messages.begin(), messages.end()};
  std::vector<ChatMessage> out;
  out.reserve(messages.size() + 1);
  if (tools.active()) {
    const std::string block = tool_block(tools);
    if (!messages.empty() && messages[0].role == "system") {
      out.push_back({"system", messages[0].content + "\n\n" + block});
      messages = messages.subspan(1);
    } else {
      const std::string& d = chat.default_system();
      out.push_back({"system", d.empty() ? block : d + "\n\n" + block});
    }
  }
  for (const ChatMessage& m : messages) {
    ChatMessage r = m;  // tool_call_id and name stay: a template may show them
    r.tool_calls.clear();
    for (const ToolCall& c : m.tool_calls) {
      if (!r.content.empty()) r.content += '\n';
      r.content += call_text(c);
    }
    if (m.role == "tool" && chat.alternates()) {
      r.role = "user";
      r.content = "<tool_response>\n" + m.content + "\n</tool_response>";
    }
    out.push_back(std::move(r));
  }
  return out;
}

ojson tools_json(const Tools& tools) {
  if (!tools.active()) return nullptr;
  ojson list = ojson::array();
  for (const ToolFunction& f : tools.functions) {
    ojson fn = {{"name", f.name}};
    if (!f.description.empty()) fn["description"] = f.description;
    fn["parameters"] = f.parameters;
    list.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return list;
}

std::string forced_call_prefix(const ChatTemplate& chat) {
  return chat.renders_tools() ? chat.call_prefix() : std::string(kForcedCallPrefix);
}

namespace {

// What the template reads beside the messages.
TemplateInputs template_inputs(const ChatTemplate& chat, const Tools& tools,
                               const ojson& template_kwargs) {
  TemplateInputs inputs;
  if (template_kwargs.is_object()) inputs.kwargs = template_kwargs;
  if (chat.renders_tools()) inputs.tools = tools_json(tools);
  return inputs;
}

}  // namespace

std::string render_conversation(const ChatTemplate& chat, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const Tools& tools,
                                const ojson& template_kwargs,
                                std::vector<TextSpan>* content_spans) {
  const std::vector<ChatMessage> turns = tool_conversation(chat, messages, tools);
  return chat.render(turns, add_generation_prompt, content_spans,
                     template_inputs(chat, tools, template_kwargs));
}

std::vector<int32_t> encode_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                         std::span<const ChatMessage> messages,
                                         bool add_generation_prompt, const Tools& tools,
                                         const ojson& template_kwargs) {
  std::vector<int32_t> ids =
      encode_conversation(tokenizer, chat, tool_conversation(chat, messages, tools),
                          add_generation_prompt, template_inputs(chat, tools, template_kwargs));
  const std::string prefix = forced_call_prefix(chat);
  if (add_generation_prompt && tools.forced() && !prefix.empty()) {
    const std::vector<int32_t> tag = tokenizer.encode(prefix, /*add_special_tokens=*/false);
    ids.insert(ids.end(), tag.begin(), tag.end());
  }
  return ids;
}

ToolReply parse_tool_output(std::string_view text, const Tools& tools) {
  ToolReply reply;
  reply.content = std::string(text);  // a plain reply stays as generated
  if (!tools.active()) return reply;
  std::vector<ToolCall> calls;
  std::string outside;
  static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  // A forced reply's prompt already holds the opening tag.
  std::string_view rest = text;
  std::string forced_text;
  if (tools.forced() && text.find(kOpen) == std::string_view::npos) {
    forced_text = std::string(kOpen) + std::string(text);
    rest = forced_text;
  }
  size_t open = rest.find(kOpen);
  if (open != std::string_view::npos) {
    while (open != std::string_view::npos) {
      outside += rest.substr(0, open);
      rest.remove_prefix(open + kOpen.size());
      const size_t close = rest.find(kClose);
      if (!read_calls(rest.substr(0, close), tools, calls)) return reply;
      rest.remove_prefix(close == std::string_view::npos ? rest.size() : close + kClose.size());
      open = rest.find(kOpen);
    }
    outside += rest;
  } else {
    // No tags: the reply, or its tail from the first '{' on, is the call (a list
    // of calls when the whole reply is one).
    // Mistral opens its calls with [TOOL_CALLS], Llama 3.1 sometimes with <|python_tag|>.
    std::string t = trim(text);
    for (std::string_view tag : {"[TOOL_CALLS]", "<|python_tag|>"})
      if (t.starts_with(tag)) t = trim(t.substr(tag.size()));
    const size_t start = t.starts_with('[') ? 0 : t.find('{');
    if (start == std::string::npos || !read_calls(std::string_view(t).substr(start), tools, calls))
      return reply;
    outside = t.substr(0, start);
  }
  if (!tools.parallel && calls.size() > 1) calls.resize(1);
  reply.content = trim(outside);
  reply.calls = std::move(calls);
  return reply;
}

std::optional<ToolCall> read_tool_call(std::string_view name, std::string_view arguments,
                                       const Tools& tools) {
  if (!tools.active()) return std::nullopt;
  ToolCall call;  // read_call parses the arguments, refusing all but an object
  if (!read_call(json{{"name", name}, {"arguments", arguments}}, tools, call)) return std::nullopt;
  return call;
}

}  // namespace edgellm
