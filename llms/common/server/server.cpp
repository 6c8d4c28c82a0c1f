#include "server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "anthropic_messages.h"
#include "api_error.h"
#include "connections.h"
#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "edgellm/json_grammar.h"
#include "edgellm/metrics.h"
#include "edgellm/reply_splitter.h"
#include "edgellm/tool_calls.h"
#include "embeddings_route.h"
#include "request_wait.h"
#include "responses_api.h"
#include "responses_store.h"
#include "slots.h"

namespace edgellm {

using json = nlohmann::json;

namespace {

std::string error_type(int status) {
  if (status == 404) return "not_found_error";
  if (status == 413 || status == 400) return "invalid_request_error";
  if (status == 429) return "rate_limit_error";
  if (status == 503) return "service_unavailable";
  return status >= 500 ? "server_error" : "invalid_request_error";
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", error_type(e.status)},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(error_body(e), "application/json");
}

// A request cut off by the SIGTERM drain: never reported as a normal end.
const ApiError kShutdown{503, "the server shut down before the request finished; retry it", "",
                         "server_shutdown"};

// "application/json", optionally with a UTF-8 charset parameter.
bool is_json_content_type(const std::string& value) {
  std::string v;
  for (char c : value)
    if (c != ' ' && c != '\t') v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t semi = v.find(';');
  if (v.substr(0, semi) != "application/json") return false;
  while (semi != std::string::npos) {
    const size_t next = v.find(';', semi + 1);
    const std::string param = v.substr(semi + 1, next - semi - 1);
    if (!param.empty() && param != "charset=utf-8" && param != "charset=\"utf-8\"") return false;
    semi = next;
  }
  return true;
}

const json* optional_field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The fields each route honours. Anything else gets 400 naming it rather than
// silence: a field we ignored could change what the client expects to get.
// `user`, `metadata` and `store` are here because they never change the output.
// clang-format off
const std::set<std::string> kGenerationFields = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "seed", "stop", "ignore_eos", "stream",
    "stream_options", "n", "logprobs", "user", "metadata", "store", "response_format"};
// clang-format on
std::set<std::string> with(std::set<std::string> fields, std::initializer_list<const char*> more) {
  fields.insert(more.begin(), more.end());
  return fields;
}
const std::set<std::string> kChatFields =
    with(kGenerationFields, {"messages", "top_logprobs", "tools", "tool_choice",
                             "parallel_tool_calls", "chat_template_kwargs", "reasoning_budget"});
const std::set<std::string> kCompletionFields = with(kGenerationFields, {"prompt"});
// Unimplemented fields that clients often send with a value that asks for
// nothing: that value is accepted, any other gets 400 (the tool fields are
// implemented on chat; on /v1/completions only their no-op values pass).
const std::map<std::string, json> kNoOpValues = {{"tools", json::array()},
                                                 {"tool_choice", "none"},
                                                 {"logit_bias", json::object()},
                                                 {"echo", false},
                                                 {"best_of", 1},
                                                 {"suffix", ""},
                                                 {"parallel_tool_calls", false}};
const std::set<std::string> kMessageFields = {"role",         "content",    "name",
                                              "tool_call_id", "tool_calls", "reasoning_content"};

// Refuses a field outside `known` unless it holds its no-op value (null is absent).
void check_fields(const json& body, const std::set<std::string>& known) {
  for (const auto& [name, value] : body.items()) {
    if (value.is_null() || known.contains(name)) continue;
    const auto noop = kNoOpValues.find(name);
    if (noop != kNoOpValues.end() && noop->second == value) continue;
    bad(name, "unsupported field '" + name + "': this server does not implement it");
  }
}

// `user`, `metadata` and `store` change nothing, but hold the types OpenAI
// documents: a wrong one is as much a client bug as anywhere else.
void check_ignored_fields(const json& body) {
  if (const json* v = optional_field(body, "user"); v && !v->is_string())
    bad("user", "'user' must be a string");
  if (const json* v = optional_field(body, "store"); v && !v->is_boolean())
    bad("store", "'store' must be a boolean");
  if (const json* v = optional_field(body, "metadata")) {
    if (!v->is_object()) bad("metadata", "'metadata' must be an object of strings");
    for (const auto& [key, value] : v->items())
      if (!value.is_string()) bad("metadata", "'metadata." + key + "' must be a string");
  }
}

// What every generation request shares, parsed and checked.
struct GenerationRequest {
  std::vector<int32_t> prompt;
  Tools tools;  // chat: the request's tools (active() when the reply is parsed for calls)
  GenerateOptions options;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // choices[].logprobs: chat's content list, or the legacy shape
};

// Server defaults for what the request leaves out. OpenAI's temperature 1 with
// no cut-off makes small models ramble into noise words; 0.7 with min-p 0.05
// keeps them on topic while still varied (README: "Sampling defaults").
constexpr float kDefaultTemperature = 0.7f;
constexpr float kDefaultMinP = 0.05f;

// A number field in [lo, hi] (`lo_open`: lo itself excluded), or 400.
float number_in(const json& v, const char* name, double lo, double hi, bool lo_open = false) {
  if (!v.is_number() || v.get<double>() < lo || (lo_open && v.get<double>() == lo) ||
      v.get<double>() > hi)
    bad(name, std::string("'") + name + "' must be a number in " + (lo_open ? "(" : "[") +
                  std::to_string(static_cast<int>(lo)) + ", " +
                  std::to_string(static_cast<int>(hi)) + "]");
  return v.get<float>();
}

// The OpenAI shape of one token's log-probability: its text (HF's decode([id]):
// U+FFFD for part of a character), logprob, and raw bytes (the part itself).
json logprob_entry(const Tokenizer& tokenizer, const TokenLogprob& t) {
  json bytes = json::array();
  for (const char c : tokenizer.token_bytes(t.token))
    bytes.push_back(static_cast<unsigned char>(c));
  return {{"token", tokenizer.decode(std::span<const int32_t>(&t.token, 1))},
          {"logprob", t.logprob},
          {"bytes", bytes}};
}

// choices[].logprobs of a chat reply, for the tokens in `logprobs`.
json chat_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprobs>& logprobs) {
  json content = json::array();
  for (const TokenLogprobs& l : logprobs) {
    json entry = logprob_entry(tokenizer, l.chosen);
    entry["top_logprobs"] = json::array();
    for (const TokenLogprob& t : l.top)
      entry["top_logprobs"].push_back(logprob_entry(tokenizer, t));
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// choices[].logprobs of a completion, OpenAI's legacy shape: the sampled token is
// always in its top_logprobs map (so up to logprobs + 1 entries), and text_offset
// counts characters from `offset` (the completion's start: there is no echo).
json completion_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprobs>& logprobs,
                         size_t& offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       text_offset = json::array();
  auto text_of = [&](int32_t id) { return tokenizer.decode(std::span<const int32_t>(&id, 1)); };
  for (const TokenLogprobs& l : logprobs) {
    const std::string text = text_of(l.chosen.token);
    tokens.push_back(text);
    token_logprobs.push_back(l.chosen.logprob);
    json alternatives = json::object();
    for (const TokenLogprob& t : l.top) alternatives[text_of(t.token)] = t.logprob;
    alternatives[text] = l.chosen.logprob;
    top.push_back(std::move(alternatives));
    text_offset.push_back(offset);
    // Characters: the bytes that start one (a token may hold part of a character).
    const std::string bytes = tokenizer.token_bytes(l.chosen.token);
    offset += static_cast<size_t>(
        std::count_if(bytes.begin(), bytes.end(), [](char c) { return (c & 0xC0) != 0x80; }));
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", text_offset}};
}

json choice_logprobs(const Tokenizer& tokenizer, bool chat,
                     const std::vector<TokenLogprobs>& logprobs, size_t& offset) {
  return chat ? chat_logprobs(tokenizer, logprobs)
              : completion_logprobs(tokenizer, logprobs, offset);
}

// Token text may end inside a character (byte-level BPE): invalid UTF-8 becomes U+FFFD.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

struct Api {
  const Model& model;
  const ServerOptions& options;
  Scheduler& scheduler;
  Metrics& metrics;
  PoolingRoutes& pooling_routes;
  std::atomic<uint64_t> next_id{1};
  // The conversations POST /v1/responses continues (previous_response_id).
  responses::Store response_store{responses::kStoredResponses, responses::kStoredBytes};

  // Reads the body (at most --max-body bytes, also when chunked), then checks its type.
  std::string read_body(const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) const {
    std::string body;
    bool too_large = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > options.max_body_bytes) {
        too_large = true;
        return false;  // stops reading: the rest is never buffered
      }
      body.append(data, n);
      return true;
    });
    if (!ok) {
      res.set_header("Connection", "close");  // the rest of the body is still on the wire
      if (too_large)
        throw ApiError{
            413, "the request body exceeds " + std::to_string(options.max_body_bytes) + " bytes",
            "", ""};
      throw ApiError{400, "the request body could not be read (malformed chunks, or too slow)", "",
                     ""};
    }
    const std::string type = req.get_header_value("Content-Type");
    if (!is_json_content_type(type))
      throw ApiError{415,
                     "Content-Type must be application/json (got '" +
                         (type.empty() ? std::string("none") : type) + "')",
                     "", "unsupported_media_type"};
    return body;
  }

  json parse_body(const std::string& text) const {
    json body;
    try {  // bounded depth: a body nested 100k deep is refused, not walked
      body = parse_json(text, "the request body");
    } catch (const Error& e) {
      bad("", e.what());
    }
    if (!body.is_object()) bad("", "the request body must be a JSON object");
    const json* m = optional_field(body, "model");
    if (!m) bad("model", "missing required field 'model'");
    if (!m->is_string()) bad("model", "'model' must be a string");
    if (m->get<std::string>() != options.model_name)
      throw ApiError{404,
                     "The model '" + m->get<std::string>() + "' does not exist (this server has '" +
                         options.model_name + "')",
                     "model", "model_not_found"};
    return body;
  }

  // The engine's encode_conversation, as chat and the Ray replicas use it:
  // message content is plain text, never the template's special tokens.
  // "tools", "tool_choice" and "parallel_tool_calls", checked by the engine.
  // Read again from the text in declared order: the prompt lists a function's
  // parameters, and the forced call emits them, in the order the client wrote.
  static Tools request_tools(const json& body, const std::string& text) {
    if (!optional_field(body, "tools") && !optional_field(body, "tool_choice") &&
        !optional_field(body, "parallel_tool_calls"))
      return {};
    const nlohmann::ordered_json ordered = parse_ordered_json(text, "the request body");
    auto get = [&](const char* name) {
      auto it = ordered.find(name);
      return it == ordered.end() ? nlohmann::ordered_json(nullptr) : *it;
    };
    try {
      return parse_tools(get("tools"), get("tool_choice"), get("parallel_tool_calls"));
    } catch (const ToolRequestError& e) {
      bad(e.param(), e.what());
    }
  }

  std::vector<int32_t> chat_prompt(const json& body, const Tools& tools) const {
    const json* messages = optional_field(body, "messages");
    if (!messages) bad("messages", "missing required field 'messages'");
    if (!messages->is_array() || messages->empty())
      bad("messages", "'messages' must be a non-empty array");
    if (!model.chat_template().available())
      bad("messages", "this model has no chat template; use /v1/completions");
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) bad(where, where + " must be an object");
      for (const auto& [name, value] : m.items())
        if (!value.is_null() && !kMessageFields.contains(name))
          bad(where + "." + name,
              "unsupported field '" + where + "." + name + "': this server does not implement it");
    }
    std::vector<ChatMessage> chat;
    try {
      chat = parse_chat_messages(*messages);
    } catch (const ToolRequestError& e) {
      bad(e.param(), e.what());
    }
    // Extra variables for the template (vLLM's and llama-server's field), e.g.
    // {"enable_thinking": false}.
    nlohmann::ordered_json kwargs = nullptr;
    if (const json* k = optional_field(body, "chat_template_kwargs")) {
      if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      kwargs = parse_ordered_json(k->dump(), "chat_template_kwargs");
    }
    try {
      return encode_conversation(model.tokenizer(), model.chat_template(), chat, true, tools,
                                 kwargs);
    } catch (const Error& e) {
      bad("messages", e.what());
    }
  }

  std::vector<int32_t> completion_prompt(const json& body) const {
    const json* prompt = optional_field(body, "prompt");
    if (!prompt) bad("prompt", "missing required field 'prompt'");
    if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string())
      prompt = &(*prompt)[0];
    if (!prompt->is_string()) bad("prompt", "'prompt' must be a string");
    std::vector<int32_t> ids = model.tokenizer().encode(prompt->get<std::string>(), true);
    if (ids.empty()) bad("prompt", "'prompt' is empty");
    return ids;
  }

  // `text`: the body as sent (a schema's properties in the client's order).
  GenerationRequest parse(const json& body, std::vector<int32_t> prompt, bool chat,
                          const std::string& text) const {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    GenerateOptions& o = r.options;
    o.sampling.temperature = kDefaultTemperature;
    o.sampling.min_p = kDefaultMinP;
    o.sampling.seed = std::random_device{}();
    if (const json* v = optional_field(body, "n"); v && *v != 1)
      bad("n", "only n = 1 is supported");
    check_ignored_fields(body);
    int max_tokens = -1;
    for (const char* name : {"max_tokens", "max_completion_tokens"}) {
      if (const json* v = optional_field(body, name)) {
        if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > 1 << 30)
          bad(name, std::string("'") + name + "' must be a positive integer");
        max_tokens = v->get<int>();
      }
    }
    if (const json* v = optional_field(body, "temperature"))
      o.sampling.temperature = number_in(*v, "temperature", 0, 2);
    if (const json* v = optional_field(body, "top_p"))
      o.sampling.top_p = number_in(*v, "top_p", 0, 1, /*lo_open=*/true);
    if (const json* v = optional_field(body, "min_p"))
      o.sampling.min_p = number_in(*v, "min_p", 0, 1);
    if (const json* v = optional_field(body, "frequency_penalty"))
      o.sampling.frequency_penalty = number_in(*v, "frequency_penalty", -2, 2);
    if (const json* v = optional_field(body, "presence_penalty"))
      o.sampling.presence_penalty = number_in(*v, "presence_penalty", -2, 2);
    if (const json* v = optional_field(body, "top_k")) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 1 << 30)
        bad("top_k", "'top_k' must be a non-negative integer");
      o.sampling.top_k = v->get<int>();
    }
    if (const json* v = optional_field(body, "seed")) {
      if (!v->is_number_integer()) bad("seed", "'seed' must be an integer");
      o.sampling.seed =
          v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    }
    if (chat) {
      if (const json* v = optional_field(body, "logprobs")) {
        if (!v->is_boolean()) bad("logprobs", "'logprobs' must be a boolean");
        r.logprobs = v->get<bool>();
      }
      if (const json* v = optional_field(body, "top_logprobs")) {
        if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 20)
          bad("top_logprobs", "'top_logprobs' must be an integer in [0, 20]");
        if (!r.logprobs) bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");
        o.logprobs = v->get<int>();
      }
      if (r.logprobs && o.logprobs < 0) o.logprobs = 0;
    } else if (const json* v = optional_field(body, "logprobs")) {  // legacy: how many alternatives
      if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 5)
        bad("logprobs", "'logprobs' must be an integer in [0, 5]");
      o.logprobs = v->get<int>();
      r.logprobs = true;
    }
    if (const json* v = optional_field(body, "stop")) {
      if (v->is_string()) {
        o.stop_strings.push_back(v->get<std::string>());
      } else if (v->is_array() && v->size() <= 4) {
        for (const json& s : *v) {
          if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
          o.stop_strings.push_back(s.get<std::string>());
        }
      } else {
        bad("stop", "'stop' must be a string or an array of at most 4 strings");
      }
    }
    if (optional_field(body, "response_format")) {
      // Structured output: a schema the engine cannot enforce is refused here,
      // naming the construct, never served as free text. Read from the text in
      // declared order (json sorts keys): objects are emitted in that order.
      try {
        o.grammar = response_format_grammar(
            parse_ordered_json(text, "the request body").at("response_format").dump());
      } catch (const JsonSchemaError& e) {
        bad("response_format", e.what());
      }
    }
    if (const json* v = optional_field(body, "ignore_eos")) {  // vLLM's extension, for benchmarks
      if (!v->is_boolean()) bad("ignore_eos", "'ignore_eos' must be a boolean");
      o.stop_at_eos = !v->get<bool>();
    }
    if (const json* v = optional_field(body, "stream")) {
      if (!v->is_boolean()) bad("stream", "'stream' must be a boolean");
      r.stream = v->get<bool>();
    }
    if (const json* v = optional_field(body, "stream_options")) {
      if (!v->is_object()) bad("stream_options", "'stream_options' must be an object");
      const json* u = optional_field(*v, "include_usage");
      if (u && !u->is_boolean()) bad("stream_options", "'include_usage' must be a boolean");
      r.include_usage = u && u->get<bool>();
    }
    const size_t context = static_cast<size_t>(model.max_context());
    const size_t room = context > r.prompt.size() ? context - r.prompt.size() : 0;
    if (room == 0 || (max_tokens > 0 && static_cast<size_t>(max_tokens) > room))
      throw ApiError{400,
                     "This model's maximum context length is " + std::to_string(context) +
                         " tokens. However, you requested " +
                         std::to_string(r.prompt.size() + std::max(max_tokens, 0)) + " tokens (" +
                         std::to_string(r.prompt.size()) + " in the prompt, " +
                         std::to_string(std::max(max_tokens, 0)) + " for the completion).",
                     max_tokens > 0 ? "max_tokens" : "messages", "context_length_exceeded"};
    o.max_tokens = max_tokens > 0 ? max_tokens : static_cast<int>(room);
    return r;
  }

  void generate(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader, bool chat) {
    const std::string text = read_body(req, res, reader);
    const json body = parse_body(text);
    check_fields(body, chat ? kChatFields : kCompletionFields);  // unknown fields first
    const Tools tools = chat ? request_tools(body, text) : Tools{};
    GenerationRequest r =
        parse(body, chat ? chat_prompt(body, tools) : completion_prompt(body), chat, text);
    r.tools = tools;
    if (chat) think(body, r);
    std::shared_ptr<RequestStream> stream = submit(r);
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    const json head = {{"id", id},
                       {"object", chat ? (r.stream ? "chat.completion.chunk" : "chat.completion")
                                       : "text_completion"},
                       {"created", static_cast<int64_t>(std::time(nullptr))},
                       {"model", options.model_name}};
    auto held_tools = std::make_shared<const Tools>(std::move(r.tools));
    auto split = std::make_shared<ReplySplitter>(r.options.reasoning);
    if (r.stream)
      stream_response(res, stream, head, chat, r.include_usage, r.logprobs, held_tools, split);
    else
      complete_response(res, stream, head, chat, r.logprobs, *held_tools, *split);
  }

  // Anthropic's Messages API: the chat request it means, served as chat is.
  void messages(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader) {
    const std::string raw = read_body(req, res, reader);
    parse_body(raw);  // JSON within the depth bound, and the model
    std::string text;
    try {
      text = anthropic::to_chat_request(parse_ordered_json(raw, "the request body")).dump();
    } catch (const anthropic::RequestError& e) {
      bad(e.param(), e.what());
    }
    GenerationRequest r = chat_request(text);
    std::shared_ptr<RequestStream> stream = submit(r);
    anthropic::write_reply(res, stream, "msg_" + std::to_string(next_id++), options.model_name,
                           std::make_shared<const Tools>(std::move(r.tools)), r.stream,
                           r.options.reasoning);
  }

  // A chat request another API was translated into (`text`: its JSON), checked
  // and read as the chat route's own.
  GenerationRequest chat_request(const std::string& text) const {
    const json body = json::parse(text);
    check_fields(body, kChatFields);
    const Tools tools = request_tools(body, text);
    GenerationRequest r = parse(body, chat_prompt(body, tools), /*chat=*/true, text);
    r.tools = tools;
    think(body, r);
    return r;
  }

  // OpenAI's Responses API: the chat request it means, after the stored
  // conversation previous_response_id names, served as chat is.
  void responses(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader) {
    const std::string raw = read_body(req, res, reader);
    parse_body(raw);  // JSON within the depth bound, and the model
    const nlohmann::ordered_json body = parse_ordered_json(raw, "the request body");
    responses::Request request;
    std::optional<nlohmann::ordered_json> history;
    std::string text;
    try {
      request = responses::read_request(body);
      if (!request.previous_response_id.empty() &&
          !(history = response_store.get(request.previous_response_id)))
        throw ApiError{400,
                       "no stored response '" + request.previous_response_id +
                           "' (never stored, stored with store: false, or evicted: the server "
                           "keeps the last " +
                           std::to_string(responses::kStoredResponses) + " responses, " +
                           std::to_string(responses::kStoredBytes >> 20) + " MiB)",
                       "previous_response_id", "previous_response_not_found"};
      text = responses::to_chat_request(body, request,
                                        history ? *history : nlohmann::ordered_json::array())
                 .dump();
    } catch (const responses::RequestError& e) {
      bad(e.param(), e.what());
    }
    GenerationRequest r;
    try {
      r = chat_request(text);
    } catch (ApiError& e) {  // named as the client wrote it
      e.param = responses::request_param(e.param);
      throw;
    }
    if (r.options.reasoning.enabled)  // a thinking or harmony template, no call forced
      bad("model",
          "this model's chat template opens reasoning blocks, which /v1/responses does not "
          "return (no reasoning items yet): use /v1/chat/completions or /v1/messages");
    std::shared_ptr<RequestStream> stream = submit(r);
    nlohmann::ordered_json conversation =
        history ? std::move(*history) : nlohmann::ordered_json::array();
    for (const auto& item : request.input) conversation.push_back(item);
    responses::write_reply(
        res, stream,
        responses::response_head(responses::new_id("resp_"), options.model_name, request.echo),
        std::make_shared<const Tools>(std::move(r.tools)), r.stream,
        request.store ? &response_store : nullptr, std::move(conversation));
  }

  // A reasoning template (ChatTemplate::thinks, or harmony's analysis): the
  // reply's block is split off and free of the grammar, and ends within the budget.
  void think(const json& body, GenerationRequest& r) const {
    int budget = options.reasoning_budget;
    if (const json* v = optional_field(body, "reasoning_budget")) {
      if (!v->is_number_integer() || v->get<int64_t>() < -1 || v->get<int64_t>() > 1 << 30)
        bad("reasoning_budget", "'reasoning_budget' must be an integer >= -1 (-1: no limit)");
      budget = v->get<int>();
    }
    r.options.reasoning = chat_reasoning(model.tokenizer(), model.chat_template(), r.prompt,
                                         r.tools.forced(), budget);
  }

  // Queues a parsed request, or refuses it (429 queue full, 503 shutting down).
  // A forced call's grammar takes the place of a response_format one (which, as
  // in OpenAI's API, shapes content replies, not calls).
  std::shared_ptr<RequestStream> submit(GenerationRequest& r) {
    if (r.tools.forced()) constrain_to_call(r);
    std::shared_ptr<RequestStream> stream = scheduler.submit(r.prompt, r.options);
    if (!stream) {
      if (scheduler.stopping()) throw ApiError{503, "the server is shutting down", "", ""};
      throw ApiError{429, "the request queue is full; retry later", "", "queue_full"};
    }
    return counted(std::move(stream));
  }

  // Replies still holding a request's stream (a streamed one until httplib drops
  // its provider): stop() lets them write their last event, the shutdown error
  // among them, before the sockets close.
  std::atomic<int> open_replies{0};
  struct OpenReply {
    std::atomic<int>& n;
    std::shared_ptr<RequestStream> stream;
    OpenReply(std::atomic<int>& c, std::shared_ptr<RequestStream> s) : n(c), stream(std::move(s)) {
      ++n;
    }
    ~OpenReply() { --n; }
  };
  // The same stream, its owners counted in open_replies (an aliasing pointer).
  std::shared_ptr<RequestStream> counted(std::shared_ptr<RequestStream> stream) {
    auto reply = std::make_shared<OpenReply>(open_replies, std::move(stream));
    return {reply, reply->stream.get()};
  }

  // A forced call (tool_choice "required" or a named function) is generated
  // under the call's JSON schema, so it always parses to the schema.
  static void constrain_to_call(GenerationRequest& r) {
    try {
      r.options.grammar = call_grammar(r.tools);
    } catch (const ToolRequestError& e) {
      bad(e.param(), e.what());
    }
  }

  // vLLM's /tokenize: the prompt tokens a chat ({model, messages}) or completion
  // ({model, prompt}) request runs, for clients counting tokens and for the
  // test that both servers encode a conversation alike.
  void tokenize(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader) const {
    const std::string text = read_body(req, res, reader);
    const json body = parse_body(text);
    check_fields(body, {"model", "messages", "prompt", "tools", "tool_choice",
                        "parallel_tool_calls", "chat_template_kwargs"});
    const std::vector<int32_t> ids = body.contains("messages")
                                         ? chat_prompt(body, request_tools(body, text))
                                         : completion_prompt(body);
    res.set_content(
        json{{"count", ids.size()}, {"max_model_len", model.max_context()}, {"tokens", ids}}.dump(),
        "application/json");
  }

  static json usage(const RequestStream& s) {
    return {{"prompt_tokens", s.prompt_tokens},
            {"completion_tokens", s.completion_tokens},
            {"total_tokens", s.prompt_tokens + s.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens}}}};
  }

  static json finish_reason(const RequestStream& s) {
    return s.finish == FinishReason::length ? "length" : "stop";
  }

  // OpenAI's message.tool_calls (`streamed`: the delta shape, with an index).
  static json tool_calls_json(const std::vector<ToolCall>& calls, bool streamed) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      json c = {{"id", calls[i].id},
                {"type", "function"},
                {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
      if (streamed) c["index"] = i;
      out.push_back(std::move(c));
    }
    return out;
  }

  void complete_response(httplib::Response& res, const std::shared_ptr<RequestStream>& stream,
                         json out, bool chat, bool logprobs, const Tools& tools,
                         ReplySplitter& split) const {
    std::string text;
    std::vector<TokenLogprobs> lp;
    while (!wait_watching_client(*stream, text, std::chrono::milliseconds(1000), &lp)) {
    }
    if (!stream->error.empty()) throw ApiError{500, stream->error, "", ""};
    if (stream->finish == FinishReason::cancelled) throw kShutdown;
    ReasoningSplitter::Piece parts = split.feed(text, /*last=*/true);
    const std::string& thought = parts.reasoning;
    json choice = {{"index", 0}, {"finish_reason", finish_reason(*stream)}};
    const std::optional<ToolReply> reply = chat ? split.end(parts.content, tools) : std::nullopt;
    if (reply) {
      choice["message"] = {{"role", "assistant"}, {"content", reply->content}};
      if (!reply->calls.empty()) {
        if (reply->content.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = tool_calls_json(reply->calls, false);
        choice["finish_reason"] = "tool_calls";
      }
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", parts.content}};
    } else
      choice["text"] = parts.content;
    if (!thought.empty()) choice["message"]["reasoning_content"] = thought;
    size_t offset = 0;
    choice["logprobs"] =
        logprobs ? choice_logprobs(model.tokenizer(), chat, lp, offset) : json(nullptr);
    out["choices"] = json::array({choice});
    out["usage"] = usage(*stream);
    out["id_slot"] = stream->slot;  // llama-server's field: the slot POST /slots/{id} saves
    res.set_content(dump(out), "application/json");
  }

  // Server-sent events: one chunk per piece of text, a last chunk with the
  // finish_reason and usage (or an error event), then [DONE]. A failed write
  // means the client is gone: the request is cancelled and its context freed.
  // With tools the reply is held until it ends (harmony: only its calls), then
  // sent as tool_calls deltas (a call is only known to be one once it parses)
  // or as one content delta. `split`: the reply's reader: a reasoning block
  // streams as reasoning_content deltas.
  void stream_response(httplib::Response& res, std::shared_ptr<RequestStream> stream, json head,
                       bool chat, bool include_usage, bool logprobs,
                       std::shared_ptr<const Tools> tools,
                       std::shared_ptr<ReplySplitter> split) const {
    const Tokenizer* tokenizer = &model.tokenizer();
    auto offset = std::make_shared<size_t>(0);  // legacy text_offset so far
    // `lp`: the logprobs of the tokens behind `text` (when asked for), moved out when sent.
    auto chunk = [head, chat, logprobs, tokenizer, offset](
                     const std::string& text, const json& finish,
                     std::vector<TokenLogprobs>* lp = nullptr, const std::string& thought = "") {
      json c = head;
      json choice = {{"index", 0}, {"finish_reason", finish}};
      if (chat) {
        choice["delta"] = !thought.empty() ? json{{"reasoning_content", thought}}
                          : text.empty() && finish.is_null()
                              ? json{{"role", "assistant"}, {"content", ""}}
                          : finish.is_null() ? json{{"content", text}}
                                             : json::object();
        if (!thought.empty() && !text.empty()) choice["delta"]["content"] = text;
      } else
        choice["text"] = text;
      choice["logprobs"] = nullptr;
      if (logprobs && lp && !lp->empty()) {
        choice["logprobs"] = choice_logprobs(*tokenizer, chat, *lp, *offset);
        lp->clear();
      }
      c["choices"] = json::array({choice});
      return "data: " + dump(c) + "\n\n";
    };
    res.set_header("Cache-Control", "no-cache");
    auto started = std::make_shared<bool>(false);
    // Logprobs whose text is still held back (a possible stop string) wait for it.
    auto pending = std::make_shared<std::vector<TokenLogprobs>>();
    auto held = std::make_shared<std::string>();  // the whole reply, with tools
    const bool hold = chat && split->holds_content(*tools);
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream, started, pending, chunk, head, chat, include_usage, hold, held, tools, split](
            size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) return true;
            stream->cancel();
            return false;
          };
          if (!*started) {
            *started = true;
            if (chat && !send(chunk("", nullptr))) return false;
          }
          std::string text;
          const bool done =
              wait_watching_client(*stream, text, std::chrono::milliseconds(500), pending.get());
          const bool got = !text.empty();
          ReasoningSplitter::Piece p = split->feed(text, done);
          std::string thought = std::move(p.reasoning);
          text = std::move(p.content);
          if (hold) {
            *held += text;
            text.clear();
          }
          // An SSE comment while nothing comes (queued, long prefill) finds a closed socket.
          if (!text.empty() || !thought.empty() || (!done && !got && pending->empty())) {
            if (!send(text.empty() && thought.empty()
                          ? std::string(": waiting\n\n")
                          : chunk(text, nullptr, pending.get(), thought)))
              return false;
          }
          if (!done) return true;
          // An engine error or the shutdown: an error event, which the OpenAI client raises.
          if (!stream->error.empty() || stream->finish == FinishReason::cancelled) {
            const std::string error = stream->error.empty()
                                          ? error_body(kShutdown)
                                          : error_body({500, stream->error, "", ""});
            if (!send("data: " + error + "\n\n")) return false;
          } else {
            json finish = finish_reason(*stream);
            if (const std::optional<ToolReply> end =
                    chat ? split->end(*held, *tools) : std::nullopt) {
              const ToolReply& reply = *end;
              if (reply.calls.empty()) {
                if (!reply.content.empty() && !send(chunk(reply.content, nullptr, pending.get())))
                  return false;
              } else {
                // Per call: its id and name, then its arguments (OpenAI's delta shapes).
                for (json& call : tool_calls_json(reply.calls, true)) {
                  const std::string arguments = call["function"]["arguments"];
                  call["function"]["arguments"] = "";
                  json delta = {{"tool_calls", json::array({call})}};
                  if (call["index"] == 0 && !reply.content.empty())
                    delta["content"] = reply.content;
                  json args = {{"index", call["index"]}, {"function", {{"arguments", arguments}}}};
                  for (const json& d : {delta, json{{"tool_calls", json::array({args})}}}) {
                    json c = head;
                    c["choices"] = json::array({{{"index", 0},
                                                 {"delta", d},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", nullptr}}});
                    if (!send("data: " + dump(c) + "\n\n")) return false;
                  }
                }
                finish = "tool_calls";
              }
            }
            // Logprobs of tokens cut with a stop string end up with the finish chunk.
            std::string last = chunk("", finish, pending.get());
            json tail = json::parse(last.substr(6));
            tail["usage"] = usage(*stream);
            tail["id_slot"] = stream->slot;
            if (!send("data: " + dump(tail) + "\n\n")) return false;
            if (include_usage) {
              json u = head;
              u["choices"] = json::array();
              u["usage"] = usage(*stream);
              if (!send("data: " + u.dump() + "\n\n")) return false;
            }
          }
          if (!send("data: [DONE]\n\n")) return false;
          sink.done();
          return true;
        },
        [stream](bool success) {
          if (!success) stream->cancel();
        });
  }

  // POST /slots/{id}?action=save|restore|erase (slots.h).
  void slots(const httplib::Request& req, httplib::Response& res,
             const httplib::ContentReader& reader) {
    const std::string text = read_body(req, res, reader);
    json body;
    if (!text.empty()) {
      try {
        body = parse_json(text, "the request body");
      } catch (const Error& e) {
        bad("", e.what());
      }
    }
    res.set_content(slot_action(scheduler, options.slot_save_path, req.matches[1].str(),
                                req.get_param_value("action"), body)
                        .dump(),
                    "application/json");
  }

  // POST /v1/embeddings and /v1/rerank (embeddings_route.h).
  void pooling(const httplib::Request& req, httplib::Response& res,
               const httplib::ContentReader& reader, bool embeddings) {
    const json body = parse_body(read_body(req, res, reader));
    check_fields(body, embeddings ? kEmbeddingFields : kRerankFields);
    check_ignored_fields(body);
    res.set_content(dump(embeddings ? pooling_routes.embeddings(body, options.model_name)
                                    : pooling_routes.rerank(body, options.model_name)),
                    "application/json");
  }

  void models(httplib::Response& res) const {
    const json m = {{"id", options.model_name},
                    {"object", "model"},
                    {"created", static_cast<int64_t>(std::time(nullptr))},
                    {"owned_by", "edgellm"},
                    {"max_model_len", model.max_context()}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(),
                    "application/json");
  }
};

}  // namespace

struct Server::Impl {
  const Model& model;
  ServerOptions options;
  Metrics metrics;
  Scheduler scheduler;
  PoolingRoutes pooling{model};
  Api api;
  GuardedHttpServer http;
  std::atomic<bool> stopped{false};

  Impl(const Model& m, const ServerOptions& o)
      : model(m),
        options(o),
        scheduler(m, o.scheduler, metrics),
        api{m, options, scheduler, metrics, pooling},
        http(limits(o), [this](int status, const std::string& message) {
          metrics.count_response(status);
          return error_body({status, message, "", ""});
        }) {}

  static ConnectionLimits limits(const ServerOptions& o) {
    ConnectionLimits l;
    l.header_timeout = o.header_timeout;
    l.max_body_bytes = o.max_body_bytes;
    // A worker for every admitted or queued request (a stream holds its worker),
    // and a few for /health, /metrics and refusals.
    l.workers = static_cast<size_t>(o.scheduler.max_batch + o.scheduler.max_queue) + 8;
    return l;
  }

  // Runs a handler, turning ApiError / engine errors into JSON error responses.
  template <typename Fn>
  httplib::Server::Handler wrap(Fn fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, {400, e.what(), "", ""});
      }
    };
  }
  // A POST route that reads its own body (bounded while it arrives, chunked or not).
  // `anthropic`: errors in the Messages API's shape.
  template <typename Fn>
  httplib::Server::HandlerWithContentReader wrap_post(Fn fn, bool anthropic = false) {
    return [fn, anthropic](const httplib::Request& req, httplib::Response& res,
                           const httplib::ContentReader& reader) {
      const auto fail = [&](const ApiError& e) {
        if (!anthropic) return send_error(res, e);
        res.status = e.status;
        if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
        res.set_content(anthropic::error_body(e.status, e.message), "application/json");
      };
      try {
        fn(req, res, reader);
      } catch (const ApiError& e) {
        fail(e);
      } catch (const Error& e) {
        fail({400, e.what(), "", ""});
      } catch (const std::exception& e) {  // a bug: still in the route's own shape
        fail({500, std::string("internal error: ") + e.what(), "", ""});
      }
    };
  }
};

Server::Server(const Model& model, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {
  Impl& s = *impl_;
  httplib::Server& http = s.http;

  http.Get("/health", s.wrap([&s](const httplib::Request&, httplib::Response& res) {
    if (s.scheduler.stopping()) throw ApiError{503, "the server is shutting down", "", ""};
    const Metrics::Snapshot m = s.metrics.load();
    res.set_content(json{{"status", "ok"}, {"active", m.active}, {"waiting", m.waiting}}.dump(),
                    "application/json");
  }));
  http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(s.metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models",
           s.wrap([&s](const httplib::Request&, httplib::Response& res) { s.api.models(res); }));
  http.Post("/v1/chat/completions",
            s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& reader) {
              s.api.generate(req, res, reader, /*chat=*/true);
            }));
  http.Post("/v1/completions", s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& reader) {
    s.api.generate(req, res, reader, /*chat=*/false);
  }));
  http.Post(
      "/v1/messages",
      s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader) { s.api.messages(req, res, reader); },
                  /*anthropic=*/true));
  http.Post("/v1/embeddings", s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                                               const httplib::ContentReader& reader) {
    s.api.pooling(req, res, reader, /*embeddings=*/true);
  }));
  http.Post("/v1/rerank", s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
    s.api.pooling(req, res, reader, /*embeddings=*/false);
  }));
  http.Post("/v1/responses", s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                                              const httplib::ContentReader& reader) {
    s.api.responses(req, res, reader);
  }));
  http.Post("/tokenize", s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader& reader) {
    s.api.tokenize(req, res, reader);
  }));
  http.Post(
      R"(/slots/([^/]*))",
      s.wrap_post([&s](const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader) { s.api.slots(req, res, reader); }));
  // Statuses httplib sets itself (404 no route, 413 body too large, ...) get the same JSON shape.
  http.set_error_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP error " + std::to_string(res.status);
    if (res.status == 404) message = "no route for " + req.method + " " + req.path;
    if (res.status == 413)
      message = "the request body exceeds " + std::to_string(s.options.max_body_bytes) + " bytes";
    send_error(res, {res.status, message, "", ""});
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string message = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          message = std::string("internal error: ") + e.what();
        } catch (...) {
        }
        send_error(res, {500, message, "", ""});
      });
  http.set_logger([&s](const httplib::Request&, const httplib::Response& res) {
    s.metrics.count_response(res.status);
  });
}

Server::~Server() {
  stop();
}

bool Server::run() {
  Impl& s = *impl_;
  if (s.stopped) return true;  // a stop signal came while loading
  if (!s.http.bind(s.options.host, s.options.port)) {
    std::fprintf(stderr, "error: cannot listen on %s:%d (in use, or not a local address)\n",
                 s.options.host.c_str(), s.options.port);
    return false;
  }
  std::fprintf(stderr,
               "edgellm server: http://%s:%d/v1 serving '%s' (%d sequences, %d-token context)\n",
               s.options.host.c_str(), s.options.port, s.options.model_name.c_str(),
               s.options.scheduler.max_batch, s.model.max_context());
  return s.http.listen_after_bind();
}

void Server::stop() {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  s.scheduler.shutdown(s.options.drain);
  // Every request has ended by now; give the replies a moment to send their last event.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (s.api.open_replies > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.http.stop();
}

}  // namespace edgellm
