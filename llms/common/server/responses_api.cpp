// OpenAI's Responses API as shapes: the request read and translated into the
// chat request it means, and the reply's Response object and stream events.
// No I/O: responses_reply.cpp writes these on `edgellm serve`.
#include "responses_api.h"

#include <ctime>
#include <random>
#include <set>

namespace edgellm::responses {

namespace {

using protocol::bad;
using protocol::check_keys;
using protocol::field;

std::string string_field(const ojson& object, const char* name, const std::string& where) {
  const ojson* v = field(object, name);
  if (!v || !v->is_string()) bad(where + "." + name, where + "." + name + " must be a string");
  return v->get<std::string>();
}

// A string, or an array of text parts (input_text / output_text), as one text.
std::string text_of(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const ojson type = part.is_object() ? part.value("type", ojson()) : ojson();
    if (type != "input_text" && type != "output_text")
      bad(at + ".type", at + ": only input_text and output_text parts are supported" +
                            (type.is_string() ? " (got '" + type.get<std::string>() + "')" : ""));
    // A reply sent back carries its annotations (none here) and logprobs: read, not used.
    check_keys(part, {"type", "text", "annotations", "logprobs"}, at);
    text += string_field(part, "text", at);
  }
  return text;
}

// One input item made plain (conversation_items).
ojson plain_item(const ojson& item, const std::string& at) {
  if (!item.is_object()) bad(at, at + " must be an object");
  const ojson* t = field(item, "type");
  if (t && !t->is_string()) bad(at + ".type", at + ".type must be a string");
  // A message may leave its type out (EasyInputMessage).
  const std::string type = t ? t->get<std::string>() : field(item, "role") ? "message" : "";
  if (type == "message") {
    check_keys(item, {"type", "role", "content", "id", "status"}, at);
    const std::string role = string_field(item, "role", at);
    if (role != "user" && role != "assistant" && role != "system" && role != "developer")
      bad(at + ".role", at + ".role must be user, assistant, system or developer");
    const ojson* content = field(item, "content");
    if (!content) bad(at + ".content", "missing " + at + ".content");
    return {{"type", "message"}, {"role", role}, {"content", text_of(*content, at + ".content")}};
  }
  if (type == "function_call") {
    check_keys(item, {"type", "call_id", "name", "arguments", "id", "status"}, at);
    return {{"type", type},
            {"call_id", string_field(item, "call_id", at)},
            {"name", string_field(item, "name", at)},
            {"arguments", string_field(item, "arguments", at)}};
  }
  if (type == "function_call_output") {
    check_keys(item, {"type", "call_id", "output", "id", "status"}, at);
    const ojson* output = field(item, "output");
    if (!output) bad(at + ".output", "missing " + at + ".output");
    return {{"type", type},
            {"call_id", string_field(item, "call_id", at)},
            {"output", text_of(*output, at + ".output")}};
  }
  if (type.empty()) bad(at + ".type", at + " needs a type (or a role, for a message)");
  bad(at + ".type", at + ": items of type '" + type + "' are not supported");
}

// A function tool, flat as the Responses API writes it.
void check_tool(const ojson& tool, const std::string& at) {
  if (!tool.is_object()) bad(at, at + " must be an object");
  const ojson type = tool.value("type", ojson());
  if (type != "function")
    bad(at + ".type",
        at + ".type " + type.dump() + ": only function tools are supported (no hosted tools)");
  check_keys(tool, {"type", "name", "description", "parameters", "strict"}, at);
  string_field(tool, "name", at);
}

// The chat shape of a function tool: the same fields, nested under "function".
ojson chat_tool(const ojson& tool) {
  ojson function = ojson::object();
  for (const auto& [key, value] : tool.items())
    if (key != "type") function[key] = value;
  return {{"type", "function"}, {"function", std::move(function)}};
}

// auto, none, required, or {"type": "function", "name"}.
void check_tool_choice(const ojson& choice) {
  if (choice.is_string()) {
    if (choice != "auto" && choice != "none" && choice != "required")
      bad("tool_choice", "tool_choice must be auto, none, required or a function");
    return;
  }
  if (!choice.is_object() || choice.value("type", ojson()) != "function")
    bad("tool_choice",
        "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...} "
        "(hosted tools and allowed_tools are not supported)");
  check_keys(choice, {"type", "name"}, "tool_choice");
  string_field(choice, "name", "tool_choice");
}

// Appends the chat messages one plain item means (after `out`'s last one).
void add_chat_message(const ojson& item, ojson& out) {
  const std::string type = item["type"];
  if (type == "message") {
    out.push_back({{"role", item["role"]}, {"content", item["content"]}});
  } else if (type == "function_call") {
    // A turn's calls belong to its assistant message, as chat's tool_calls.
    if (out.empty() || out.back()["role"] != "assistant")
      out.push_back({{"role", "assistant"}, {"content", nullptr}});
    ojson& turn = out.back();
    if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
    turn["tool_calls"].push_back(
        {{"id", item["call_id"]},
         {"type", "function"},
         {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
  } else {  // function_call_output
    out.push_back(
        {{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", item["output"]}});
  }
}

}  // namespace

ojson conversation_items(const ojson& items, const std::string& where) {
  if (!items.is_array()) bad(where, where + " must be a string or an array of items");
  ojson out = ojson::array();
  for (size_t i = 0; i < items.size(); ++i)
    out.push_back(plain_item(items[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

Request read_request(const ojson& body) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  if (field(body, "reasoning"))
    bad("reasoning",
        "unsupported field 'reasoning': the chat route has no reasoning effort to map it onto "
        "(reasoning_budget is a token count)");
  // Fields clients (Codex among them) send with a value that asks for nothing
  // this server does not do: that value passes, any other is refused.
  const ojson no_op = {{"include", ojson::array()},
                       {"truncation", "disabled"},
                       {"text", {{"format", {{"type", "text"}}}}}};
  ojson rest = body;
  for (const auto& [key, value] : no_op.items())
    if (rest.contains(key) && rest[key] == value) rest.erase(key);
  check_keys(rest,
             {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
              "max_output_tokens", "temperature", "top_p", "stream", "store",
              "previous_response_id", "metadata", "user", "prompt_cache_key"},
             "");
  Request r;
  const ojson* input = field(body, "input");
  if (!input) bad("input", "missing required field 'input'");
  if (input->is_string()) {
    r.input = ojson::array({{{"type", "message"}, {"role", "user"}, {"content", *input}}});
  } else {
    r.input = conversation_items(*input, "input");
    if (r.input.empty()) bad("input", "'input' must be a string or a non-empty array of items");
  }
  for (const char* name : {"stream", "store", "parallel_tool_calls"})
    if (const ojson* v = field(body, name); v && !v->is_boolean())
      bad(name, std::string("'") + name + "' must be a boolean");
  // prompt_cache_key (Codex sends it) groups requests for a cache: every prefix is cached here.
  for (const char* name : {"instructions", "previous_response_id", "user", "prompt_cache_key"})
    if (const ojson* v = field(body, name); v && !v->is_string())
      bad(name, std::string("'") + name + "' must be a string");
  r.stream = body.value("stream", ojson(false)) == true;
  r.store = body.value("store", ojson(true)) != false;
  if (const ojson* v = field(body, "previous_response_id")) r.previous_response_id = *v;
  if (const ojson* v = field(body, "max_output_tokens");
      v && (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > 1 << 30))
    bad("max_output_tokens", "'max_output_tokens' must be a positive integer");
  if (const ojson* m = field(body, "metadata")) {  // echoed; changes nothing
    if (!m->is_object()) bad("metadata", "'metadata' must be an object of strings");
    for (const auto& [key, value] : m->items())
      if (!value.is_string()) bad("metadata", "'metadata." + key + "' must be a string");
  }
  if (const ojson* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < tools->size(); ++i)
      check_tool((*tools)[i], "tools[" + std::to_string(i) + "]");
  }
  if (const ojson* choice = field(body, "tool_choice")) check_tool_choice(*choice);

  auto echo = [&](const char* name, ojson fallback) {
    const ojson* v = field(body, name);
    r.echo[name] = v ? *v : std::move(fallback);
  };
  echo("instructions", nullptr);
  echo("max_output_tokens", nullptr);
  echo("metadata", ojson::object());
  echo("parallel_tool_calls", true);
  echo("previous_response_id", nullptr);
  r.echo["store"] = r.store;
  echo("temperature", nullptr);
  echo("tool_choice", "auto");
  echo("tools", ojson::array());
  echo("top_p", nullptr);
  echo("user", nullptr);
  return r;
}

ojson to_chat_request(const ojson& body, const Request& request, const ojson& history) {
  ojson out = {{"model", body.value("model", ojson())}};
  if (const ojson* v = field(body, "max_output_tokens")) out["max_tokens"] = *v;
  for (const char* name : {"temperature", "top_p", "stream", "tool_choice", "parallel_tool_calls"})
    if (const ojson* v = field(body, name)) out[name] = *v;
  if (const ojson* c = field(body, "tool_choice"); c && c->is_object())
    out["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
  if (const ojson* tools = field(body, "tools")) {
    out["tools"] = ojson::array();
    for (const ojson& tool : *tools) out["tools"].push_back(chat_tool(tool));
  }
  ojson messages = ojson::array();
  // Instructions are this request's alone: a previous response's are not carried over.
  if (const ojson* v = field(body, "instructions"))
    messages.push_back({{"role", "system"}, {"content", *v}});
  for (const ojson* items : {&history, &request.input})
    for (const ojson& item : *items) add_chat_message(item, messages);
  out["messages"] = std::move(messages);
  return out;
}

std::string request_param(const std::string& chat_param) {
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param.starts_with("messages")) return "input";
  const std::string nested = ".function";  // tools[i].function.name -> tools[i].name
  if (chat_param.starts_with("tools[")) {
    std::string p = chat_param;
    if (const size_t at = p.find(nested); at != std::string::npos) p.erase(at, nested.size());
    return p;
  }
  return chat_param;
}

std::string new_id(const std::string& prefix) {
  // The OS's generator, not a seeded PRNG whose state other ids would reveal.
  static thread_local std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int word = 0; word < 4; ++word)
    for (uint32_t bits = device(), i = 0; i < 8; ++i, bits >>= 4) id += kHex[bits & 15];
  return id;
}

ojson response_head(const std::string& id, const std::string& model, const ojson& echo) {
  ojson head = {{"id", id},
                {"object", "response"},
                {"created_at", static_cast<int64_t>(std::time(nullptr))},
                {"status", "in_progress"},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"model", model},
                {"output", ojson::array()},
                {"reasoning", nullptr},
                {"text", {{"format", {{"type", "text"}}}}},
                {"truncation", "disabled"},
                {"usage", nullptr}};
  for (const auto& [key, value] : echo.items()) head[key] = value;
  return head;
}

namespace {

bool cut_short(const Outcome& o) {
  return o.finish == FinishReason::length;
}

ojson message_item(const std::string& id, const std::string& text, const char* status) {
  ojson content = ojson::array();
  if (std::string(status) != "in_progress")
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}});
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

ojson call_item(const std::string& id, const ToolCall& call, const char* status) {
  return {{"type", "function_call"},     {"id", id},
          {"call_id", call.id},          {"name", call.name},
          {"arguments", call.arguments}, {"status", status}};
}

ojson usage(const Outcome& o) {
  return {{"input_tokens", o.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", o.cached_tokens}, {"cache_write_tokens", 0}}},
          {"output_tokens", o.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", o.prompt_tokens + o.completion_tokens}};
}

const char* item_status(const Outcome& o) {
  return cut_short(o) ? "incomplete" : "completed";
}

}  // namespace

ojson output_items(const ToolReply& reply, const Outcome& o) {
  ojson out = ojson::array();
  if (!reply.content.empty() || reply.calls.empty())
    out.push_back(message_item(new_id("msg_"), reply.content, item_status(o)));
  for (const ToolCall& call : reply.calls)
    out.push_back(call_item(new_id("fc_"), call, item_status(o)));
  return out;
}

ojson response(ojson head, const ojson& output, const Outcome& o) {
  head["status"] = cut_short(o) ? "incomplete" : "completed";
  if (cut_short(o)) head["incomplete_details"] = {{"reason", "max_output_tokens"}};
  head["output"] = output;
  head["usage"] = usage(o);
  return head;
}

// Appends one event to `out`. Events are numbered as they are written, so each
// is appended in its own statement (the operands of `+` have no order).
void StreamEvents::event(std::string& out, ojson data) {
  data["sequence_number"] = sequence_++;
  out += "event: " + data.at("type").get<std::string>() +
         "\ndata: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string StreamEvents::start() {
  std::string out;
  event(out, {{"type", "response.created"}, {"response", head_}});
  event(out, {{"type", "response.in_progress"}, {"response", head_}});
  return out;
}

void StreamEvents::open_message(std::string& out) {
  message_id_ = new_id("msg_");
  text_.clear();
  const ojson part = {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}};
  event(out, {{"type", "response.output_item.added"},
              {"output_index", output_.size()},
              {"item", message_item(message_id_, "", "in_progress")}});
  event(out, {{"type", "response.content_part.added"},
              {"item_id", message_id_},
              {"output_index", output_.size()},
              {"content_index", 0},
              {"part", part}});
}

void StreamEvents::delta(std::string& out, const std::string& text) {
  if (text.empty()) return;
  if (message_id_.empty()) open_message(out);
  text_ += text;
  event(out, {{"type", "response.output_text.delta"},
              {"item_id", message_id_},
              {"output_index", output_.size()},
              {"content_index", 0},
              {"delta", text},
              {"logprobs", ojson::array()}});
}

std::string StreamEvents::text(const std::string& text) {
  std::string out;
  delta(out, text);
  return out;
}

void StreamEvents::close_message(std::string& out, const Outcome& o) {
  const ojson item = message_item(message_id_, text_, item_status(o));
  const size_t index = output_.size();
  event(out, {{"type", "response.output_text.done"},
              {"item_id", message_id_},
              {"output_index", index},
              {"content_index", 0},
              {"text", text_},
              {"logprobs", ojson::array()}});
  event(out, {{"type", "response.content_part.done"},
              {"item_id", message_id_},
              {"output_index", index},
              {"content_index", 0},
              {"part", item["content"][0]}});
  event(out, {{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(item);
  message_id_.clear();
}

void StreamEvents::call_events(std::string& out, const ToolCall& call, const Outcome& o) {
  const std::string id = new_id("fc_");
  const size_t index = output_.size();
  ToolCall empty = call;
  empty.arguments = "";
  const ojson item = call_item(id, call, item_status(o));
  output_.push_back(item);
  event(out, {{"type", "response.output_item.added"},
              {"output_index", index},
              {"item", call_item(id, empty, "in_progress")}});
  event(out, {{"type", "response.function_call_arguments.delta"},
              {"item_id", id},
              {"output_index", index},
              {"delta", call.arguments}});
  event(out, {{"type", "response.function_call_arguments.done"},
              {"item_id", id},
              {"output_index", index},
              {"arguments", call.arguments}});
  event(out, {{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
}

std::string StreamEvents::end(const ToolReply* held, const Outcome& o) {
  std::string out;
  if (held) {
    // The same items as the whole reply's: a message when there is text or no call.
    if (!held->content.empty() || held->calls.empty()) {
      open_message(out);
      delta(out, held->content);
      close_message(out, o);
    }
    for (const ToolCall& call : held->calls) call_events(out, call, o);
  } else {
    if (message_id_.empty()) open_message(out);  // a reply with no text still has its message
    close_message(out, o);
  }
  const char* type = cut_short(o) ? "response.incomplete" : "response.completed";
  event(out, {{"type", type}, {"response", response(head_, output_, o)}});
  return out;
}

std::string StreamEvents::failed(const std::string& message) {
  ojson r = head_;
  r["status"] = "failed";
  r["error"] = {{"code", "server_error"}, {"message", message}};
  r["output"] = output_;
  std::string out;
  event(out, {{"type", "response.failed"}, {"response", r}});
  return out;
}

}  // namespace edgellm::responses
