// Anthropic's Messages API as shapes: the request translated into the chat
// request it means, and the reply's message and stream events. No I/O: both
// servers (edgellm serve through anthropic_reply.cpp, the Ray ingress through
// the edgellm_anthropic module) write these.
#include "anthropic_messages.h"

#include <set>

namespace edgellm::anthropic {

namespace {

using protocol::bad;
using protocol::field;

// check_keys, and `cache_control` marks a prefix for caching: this server caches every
// prefix anyway, so the mark (an object) asks for nothing more.
void check_keys(const ojson& object, const std::set<std::string>& known, const std::string& where) {
  protocol::check_keys(object, known, where);
  if (const ojson* mark = field(object, "cache_control"); mark && !mark->is_object()) {
    const std::string at = where.empty() ? "cache_control" : where + ".cache_control";
    bad(at, at + " must be an object");
  }
}

const std::set<std::string> kTextBlock = {"type", "text", "cache_control"};

// A string, or an array of text blocks, as one text.
std::string text_of(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& block = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!block.is_object() || block.value("type", ojson()) != "text")
      bad(at, at + ": only text blocks are supported here");
    check_keys(block, kTextBlock, at);
    const ojson* t = field(block, "text");
    if (!t || !t->is_string()) bad(at + ".text", at + ".text must be a string");
    text += t->get<std::string>();
  }
  return text;
}

// One Messages turn as chat messages: an assistant turn is one message (its
// text and tool_use blocks as tool_calls); a user turn is one tool message per
// tool_result block, then its text, if any, as a user message.
void add_turn(const ojson& m, const std::string& where, ojson& out) {
  if (!m.is_object()) bad(where, where + " must be an object");
  check_keys(m, {"role", "content"}, where);
  const ojson* role = field(m, "role");
  if (!role || (*role != "user" && *role != "assistant"))
    bad(where + ".role", where + ".role must be user or assistant");
  const bool assistant = *role == "assistant";
  const ojson* content = field(m, "content");
  if (!content) bad(where + ".content", "missing " + where + ".content");
  if (content->is_string()) {
    out.push_back({{"role", *role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) bad(where + ".content", where + ".content must be a string or blocks");
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& block = (*content)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
      bad(at, at + " must be a content block with a type");
    const std::string type = block["type"].get<std::string>();
    if (type == "text") {
      text += text_of(ojson::array({block}), where + ".content");
    } else if (type == "thinking" && assistant) {  // a reasoning reply sent back
      check_keys(block, {"type", "thinking", "signature", "cache_control"}, at);
      const ojson* t = field(block, "thinking");
      if (!t || !t->is_string()) bad(at + ".thinking", at + ".thinking must be a string");
      reasoning += t->get<std::string>();
    } else if (type == "tool_use" && assistant) {
      check_keys(block, {"type", "id", "name", "input", "cache_control"}, at);
      const ojson *id = field(block, "id"), *name = field(block, "name"),
                  *input = field(block, "input");
      if (!id || !id->is_string() || !name || !name->is_string())
        bad(at, at + ": a tool_use block needs string 'id' and 'name'");
      if (!input || !input->is_object()) bad(at + ".input", at + ".input must be an object");
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", input->dump()}}}});
    } else if (type == "tool_result" && !assistant) {
      check_keys(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, at);
      const ojson* id = field(block, "tool_use_id");
      if (!id || !id->is_string()) bad(at + ".tool_use_id", at + ".tool_use_id must be a string");
      if (const ojson* e = field(block, "is_error"); e && *e != false)
        bad(at + ".is_error",
            at + ".is_error: an error result has no form in the model's template; send the "
                 "error as the result's text");
      if (!text.empty()) bad(at, at + ": tool_result blocks must come before the turn's text");
      const ojson* result = field(block, "content");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", *id},
                     {"content", result ? text_of(*result, at + ".content") : ""}});
    } else {
      bad(at + ".type", at + ": content blocks of type '" + type + "' are not supported" +
                            (assistant ? " in an assistant turn" : " in a user turn"));
    }
  }
  if (assistant) {
    ojson message = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) message["tool_calls"] = std::move(calls);
    if (text.empty() && message.contains("tool_calls")) message["content"] = nullptr;
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    out.push_back(std::move(message));
  } else if (!text.empty() || out.empty() || out.back()["role"] != "tool") {
    out.push_back({{"role", "user"}, {"content", text}});
  }
}

ojson chat_tools(const ojson& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad(at, at + " must be an object");
    if (const ojson* type = field(t, "type"); type && *type != "custom")
      bad(at + ".type",
          at + ".type " + type->dump() + ": server tools are not supported (only \"custom\" ones)");
    check_keys(t, {"type", "name", "description", "input_schema", "cache_control"}, at);
    const ojson* name = field(t, "name");
    if (!name || !name->is_string()) bad(at + ".name", at + ".name must be a string");
    const ojson* schema = field(t, "input_schema");
    if (!schema) bad(at + ".input_schema", "missing " + at + ".input_schema");
    if (!schema->is_object())
      bad(at + ".input_schema", at + ".input_schema must be a JSON schema object");
    ojson function = {{"name", *name}, {"parameters", *schema}};
    if (const ojson* d = field(t, "description")) {
      if (!d->is_string()) bad(at + ".description", at + ".description must be a string");
      function["description"] = *d;
    }
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// tool_choice: auto, any (some tool: OpenAI's required), tool (that one), none.
void chat_tool_choice(const ojson& choice, ojson& out) {
  if (!choice.is_object()) bad("tool_choice", "'tool_choice' must be an object with a type");
  check_keys(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
  const ojson* t = field(choice, "type");
  const std::string type = t && t->is_string() ? t->get<std::string>() : "";
  if (type == "auto") {
    out["tool_choice"] = "auto";
  } else if (type == "any") {
    out["tool_choice"] = "required";
  } else if (type == "none") {
    out["tool_choice"] = "none";
  } else if (type == "tool") {
    const ojson* name = field(choice, "name");
    if (!name || !name->is_string()) bad("tool_choice.name", "tool_choice.name must be a string");
    out["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
  } else {
    bad("tool_choice.type", "tool_choice.type must be auto, any, tool or none");
  }
  if (const ojson* p = field(choice, "disable_parallel_tool_use")) {
    if (!p->is_boolean())
      bad("tool_choice.disable_parallel_tool_use", "'disable_parallel_tool_use' must be a boolean");
    out["parallel_tool_calls"] = !p->get<bool>();
  }
}

}  // namespace

ojson to_chat_request(const ojson& body) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  check_keys(body,
             {"model", "max_tokens", "messages", "system", "stop_sequences", "stream",
              "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata", "thinking"},
             "");
  ojson out = ojson::object();
  out["model"] = body.value("model", ojson());
  const ojson* max_tokens = field(body, "max_tokens");
  if (!max_tokens) bad("max_tokens", "missing required field 'max_tokens'");
  out["max_tokens"] = *max_tokens;
  for (const char* name : {"stream", "top_p", "top_k"})
    if (const ojson* v = field(body, name)) out[name] = *v;
  if (const ojson* m = field(body, "metadata")) {  // names the user; changes nothing
    if (!m->is_object()) bad("metadata", "'metadata' must be an object");
    check_keys(*m, {"user_id"}, "metadata");
    if (const ojson* u = field(*m, "user_id"); u && !u->is_string())
      bad("metadata.user_id", "'metadata.user_id' must be a string");
  }
  if (const ojson* t = field(body, "temperature")) {  // Anthropic's range is [0, 1]
    if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 1)
      bad("temperature", "'temperature' must be a number in [0, 1]");
    out["temperature"] = *t;
  }
  // Extended thinking, for a reasoning model's template: the block's budget
  // (disabled: none, the block is closed at once). Anthropic's minimum of 1024
  // is not imposed: small models think briefly.
  if (const ojson* t = field(body, "thinking")) {
    if (!t->is_object()) bad("thinking", "'thinking' must be an object");
    check_keys(*t, {"type", "budget_tokens"}, "thinking");
    const ojson type = t->value("type", ojson());
    if (type == "enabled") {
      const ojson* b = field(*t, "budget_tokens");
      if (!b || !b->is_number_integer() || b->get<int64_t>() < 0 || b->get<int64_t>() > 1 << 30)
        bad("thinking.budget_tokens", "'thinking.budget_tokens' must be a non-negative integer");
      out["reasoning_budget"] = *b;
    } else if (type == "disabled") {
      if (field(*t, "budget_tokens"))
        bad("thinking.budget_tokens", "'budget_tokens' goes with thinking.type enabled");
      out["reasoning_budget"] = 0;
    } else {
      bad("thinking.type", "thinking.type must be enabled or disabled");
    }
  }
  if (const ojson* s = field(body, "stop_sequences")) {
    if (!s->is_array()) bad("stop_sequences", "'stop_sequences' must be an array of strings");
    if (s->size() > 4) bad("stop_sequences", "at most 4 stop_sequences are supported");
    for (const ojson& x : *s)
      if (!x.is_string() || x.get<std::string>().empty())
        bad("stop_sequences", "'stop_sequences' must be non-empty strings");
    if (!s->empty()) out["stop"] = *s;
  }

  ojson messages = ojson::array();
  if (const ojson* system = field(body, "system")) {
    const std::string text = text_of(*system, "system");
    if (!text.empty()) messages.push_back({{"role", "system"}, {"content", text}});
  }
  const ojson* turns = field(body, "messages");
  if (!turns) bad("messages", "missing required field 'messages'");
  if (!turns->is_array() || turns->empty()) bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < turns->size(); ++i)
    add_turn((*turns)[i], "messages[" + std::to_string(i) + "]", messages);
  // The reply is always a new assistant turn after the prompt: continuing a
  // partial one (Anthropic's prefill) would need the template to leave it open.
  if (turns->back().is_object() && turns->back().value("role", "") == "assistant")
    bad("messages", "a final assistant turn (response prefill) is not supported");
  out["messages"] = std::move(messages);

  if (const ojson* tools = field(body, "tools")) out["tools"] = chat_tools(*tools);
  if (const ojson* choice = field(body, "tool_choice")) chat_tool_choice(*choice, out);
  return out;
}

std::string stop_reason(FinishReason finish, const std::string& stop_string, bool tool_use) {
  if (tool_use) return "tool_use";
  if (finish == FinishReason::length) return "max_tokens";
  return stop_string.empty() ? "end_turn" : "stop_sequence";
}

ojson content_blocks(const std::string& text, const std::vector<ToolCall>& calls,
                     const std::string& thinking) {
  ojson blocks = ojson::array();
  // No signature: Anthropic's verifies its own models' thinking; ours has none to give.
  if (!thinking.empty())
    blocks.push_back({{"type", "thinking"}, {"thinking", thinking}, {"signature", ""}});
  if (!text.empty() || calls.empty()) blocks.push_back({{"type", "text"}, {"text", text}});
  for (const ToolCall& c : calls)
    blocks.push_back({{"type", "tool_use"},
                      {"id", c.id},
                      {"name", c.name},
                      {"input", ojson::parse(c.arguments)}});
  return blocks;
}

ojson usage(size_t prompt_tokens, size_t cached_tokens, size_t output_tokens) {
  return {{"input_tokens", prompt_tokens - cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached_tokens},
          {"output_tokens", output_tokens}};
}

std::string error_body(int status, const std::string& message) {
  std::string type = "api_error";
  if (status == 400 || status == 415) type = "invalid_request_error";
  if (status == 404) type = "not_found_error";
  if (status == 408) type = "timeout_error";
  if (status == 413) type = "request_too_large";
  if (status == 429) type = "rate_limit_error";
  if (status == 503) type = "overloaded_error";
  return ojson{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump(
      -1, ' ', false, ojson::error_handler_t::replace);
}

std::string event(const ojson& data) {
  return "event: " + data.at("type").get<std::string>() +
         "\ndata: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

ojson message_head(const std::string& id, const std::string& model) {
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", ojson::array()},
          {"stop_reason", nullptr},
          {"stop_sequence", nullptr}};
}

namespace {

ojson stop_sequence(const Outcome& o) {
  return o.stop_string.empty() ? ojson() : ojson(o.stop_string);
}

// The events of one whole content block: start, its delta (when not empty), stop.
std::string block_events(size_t index, const ojson& block) {
  ojson start = block;
  ojson delta;
  if (block["type"] == "text") {
    start["text"] = "";
    delta = {{"type", "text_delta"}, {"text", block["text"]}};
  } else {
    start["input"] = ojson::object();
    delta = {{"type", "input_json_delta"}, {"partial_json", block["input"].dump()}};
  }
  std::string out =
      event({{"type", "content_block_start"}, {"index", index}, {"content_block", start}});
  if (block["type"] != "text" || !block["text"].get<std::string>().empty())
    out += event({{"type", "content_block_delta"}, {"index", index}, {"delta", delta}});
  return out + event({{"type", "content_block_stop"}, {"index", index}});
}

}  // namespace

ojson message(ojson head, const ToolReply& reply, const Outcome& o, const std::string& thinking) {
  head["content"] = content_blocks(reply.content, reply.calls, thinking);
  head["stop_reason"] = stop_reason(o.finish, o.stop_string, !reply.calls.empty());
  head["stop_sequence"] = stop_sequence(o);
  head["usage"] = usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens);
  return head;
}

std::string StreamEvents::start() const {
  ojson head = head_;
  head["usage"] = usage(0, 0, 0);
  return event({{"type", "message_start"}, {"message", head}}) + event({{"type", "ping"}});
}

std::string StreamEvents::open(Block block) {
  if (open_ == block) return "";
  std::string out = close();
  open_ = block;
  const ojson start = block == Block::thinking
                          ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                          : ojson{{"type", "text"}, {"text", ""}};
  had_text_ |= block == Block::text;
  return out +
         event({{"type", "content_block_start"}, {"index", index_}, {"content_block", start}});
}

std::string StreamEvents::close() {
  if (open_ == Block::none) return "";
  open_ = Block::none;
  return event({{"type", "content_block_stop"}, {"index", index_++}});
}

std::string StreamEvents::thinking(const std::string& text) {
  if (text.empty()) return "";
  std::string out = open(Block::thinking);  // first: it may move the index on
  const ojson delta = {{"type", "thinking_delta"}, {"thinking", text}};
  return out + event({{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
}

std::string StreamEvents::text(const std::string& text) {
  if (text.empty()) return "";
  std::string out = open(Block::text);  // first: it may move the index on
  const ojson delta = {{"type", "text_delta"}, {"text", text}};
  return out + event({{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
}

std::string StreamEvents::end(const ToolReply* held, const Outcome& o) {
  std::string out;
  if (!held && !had_text_) out += open(Block::text);
  out += close();
  if (held) {
    // Where the text streamed already (harmony holds only its calls), no empty text block.
    for (const ojson& block : content_blocks(held->content, held->calls))
      if (!(had_text_ && block["type"] == "text" && block["text"] == ""))
        out += block_events(index_++, block);
  }
  const bool tool_use = held && !held->calls.empty();
  const ojson delta = {{"stop_reason", stop_reason(o.finish, o.stop_string, tool_use)},
                       {"stop_sequence", stop_sequence(o)}};
  out += event({{"type", "message_delta"},
                {"delta", delta},
                {"usage", usage(o.prompt_tokens, o.cached_tokens, o.completion_tokens)}});
  return out + event({{"type", "message_stop"}});
}

std::string error_event(int status, const std::string& message) {
  return "event: error\ndata: " + error_body(status, message) + "\n\n";
}

}  // namespace edgellm::anthropic
