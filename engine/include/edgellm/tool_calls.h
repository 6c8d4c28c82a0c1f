// Tool calling as in the OpenAI API, one implementation for every front end
// (edgellm serve, the Ray replicas through the Python binding):
//   - parse_tools: a request's "tools" and "tool_choice", checked, errors naming the field;
//   - encode_conversation with Tools: the tools rendered into the system turn,
//     assistant tool_calls and role "tool" results rendered as text;
//   - call_schema: the JSON schema a forced call (required / a named function) is
//     constrained to through structured output;
//   - parse_tool_output: the model's text turned back into tool calls when it is one.
//
// A template that renders tools (Qwen, Llama 3.1, Mistral, Hermes, ...) gets
// them as transformers passes them: `tools`, assistant `tool_calls`, "tool"
// messages. For one that does not, the format is Hermes / Qwen 2.5's, which
// small instruction models have seen: the function signatures inside
// <tools></tools> in the system turn, a call as
// <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/json_grammar.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

// A bad "tools" / "tool_choice" / message tool_calls field: `param` names it
// as OpenAI's error.param does ("tools[0].function.name").
class ToolRequestError : public Error {
 public:
  ToolRequestError(std::string param, const std::string& message)
      : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

struct ToolFunction {
  std::string name;
  std::string description;
  // A JSON schema (an object), its properties in declared order: the prompt
  // shows them and the constrained call emits them in that order.
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();
};

struct Tools {
  // OpenAI's tool_choice: none (no call: the tools are not rendered either),
  // auto (the model may call; parsed, not constrained), required (one call to
  // any tool), function (one call to `forced_name`).
  enum class Choice { none, automatic, required, function };
  std::vector<ToolFunction> functions;
  Choice choice = Choice::automatic;
  std::string forced_name;
  // parallel_tool_calls: false keeps only the first call of a reply. A forced
  // reply holds exactly one call either way.
  bool parallel = true;

  // Tools reach the prompt and the reply is parsed for calls.
  bool active() const { return !functions.empty() && choice != Choice::none; }
  // The reply must be one call: generation is constrained to call_schema().
  bool forced() const {
    return active() && (choice == Choice::required || choice == Choice::function);
  }
  const ToolFunction* find(std::string_view name) const;
};

// "tools" and "tool_choice" of a request (null values: absent), parsed as
// ordered_json to keep the declared order of properties. Without tools,
// tool_choice may only be "none" or "auto"; a named function must be one of the
// tools. Throws ToolRequestError.
Tools parse_tools(const nlohmann::ordered_json& tools, const nlohmann::ordered_json& tool_choice,
                  const nlohmann::ordered_json& parallel_tool_calls = nullptr);

// An assistant message's "tool_calls" (`where`: "messages[1].tool_calls").
// Arguments may be JSON text (OpenAI) or an object; either becomes JSON text.
std::vector<ToolCall> parse_tool_calls(const nlohmann::json& tool_calls, const std::string& where);

// OpenAI's chat "messages": a non-empty array of {role, content, tool_calls,
// tool_call_id, name, reasoning_content (assistant only)}; role system, developer (read as system),
// user, assistant or tool; content a string or text parts (absent or null only beside tool_calls,
// which only an assistant may have: parse_tool_calls). Fields outside these are the front end's to
// refuse. Throws ToolRequestError naming the field ("messages[2].role").
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& messages);

// The JSON schema of a forced reply: {"name": <an allowed name>, "arguments":
// <that function's parameters>}, anyOf over the allowed functions. Each
// parameters schema gets the "$id" urn:edgellm:tool:<name>: its own resource,
// so its "#/$defs/..." and "#" references mean the parameters, as JSON Schema
// reads an embedded schema.
nlohmann::ordered_json call_schema(const Tools& tools);

// The grammar of call_schema, for GenerateOptions::grammar. A function whose
// parameters use a construct structured output cannot enforce throws
// ToolRequestError naming tools[i].function.parameters.
std::shared_ptr<const JsonGrammar> call_grammar(const Tools& tools);

// What follows the generation prompt of a forced reply: the opening tag the
// system turn tells the model to write, so the constrained JSON comes after it.
inline constexpr std::string_view kForcedCallPrefix = "<tool_call>\n";

// The conversation for a template that does not render tools itself: the tool
// block appended to the system turn (one is added when there is none, keeping
// the template's default system prompt), assistant tool_calls as <tool_call>
// text, tool results as the template's "tool" role (a user turn wrapped in
// <tool_response> for templates that alternate user/model). A template that
// renders tools gets the messages as they are.
std::vector<ChatMessage> tool_conversation(const ChatTemplate& chat,
                                           std::span<const ChatMessage> messages,
                                           const Tools& tools);

// OpenAI's "tools" list as templates read it (null when no tool is active).
nlohmann::ordered_json tools_json(const Tools& tools);

// What a forced reply's prompt ends with after the generation prompt: the
// template's own call opening when it renders tools, else kForcedCallPrefix.
std::string forced_call_prefix(const ChatTemplate& chat);

// The text of tool_conversation rendered by the template, the tools passed to
// one that renders them. `template_kwargs`: the request's chat_template_kwargs
// (an object, or null). `content_spans` as in ChatTemplate::render.
std::string render_conversation(const ChatTemplate& chat, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const Tools& tools,
                                const nlohmann::ordered_json& template_kwargs = nullptr,
                                std::vector<TextSpan>* content_spans = nullptr);

// The tokens of render_conversation (contents plain, as Tokenizer::encode
// keeps them), then forced_call_prefix for a forced reply.
std::vector<int32_t> encode_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                         std::span<const ChatMessage> messages,
                                         bool add_generation_prompt, const Tools& tools,
                                         const nlohmann::ordered_json& template_kwargs = nullptr);

struct ToolReply {
  std::string content;          // text outside the calls (trimmed); all of it when no call
  std::vector<ToolCall> calls;  // empty: a plain reply
};

// The model's reply read as tool calls: <tool_call> blocks (each an object or a
// list of objects), else the whole reply (or its tail after some text) as one
// JSON object. A call needs a "name" among the tools and object "arguments"
// (or "parameters"); anything else, malformed JSON included, is plain content.
// Ids are "call_" + 24 random hex digits.
ToolReply parse_tool_output(std::string_view text, const Tools& tools);

// One call a model wrote in a framing of its own (harmony's recipient and
// body, edgellm/harmony.h): a ToolCall when tools are active, `name` is among
// them and `arguments` is a JSON object; else nothing (the text is content).
std::optional<ToolCall> read_tool_call(std::string_view name, std::string_view arguments,
                                       const Tools& tools);

}  // namespace edgellm
