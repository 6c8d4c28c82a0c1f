// Tool calling: request fields, rendering into the conversation, the forced
// call's schema and the reply parser (edgellm/tool_calls.h).
#include "edgellm/tool_calls.h"

#include <gtest/gtest.h>

#include "edgellm/json_file.h"
#include "runtime/json_matcher.h"

namespace edgellm {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

const ojson kWeather = ojson::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time"}}])");

Tools weather(const ojson& choice = nullptr) {
  return parse_tools(kWeather, choice);
}

// The param a bad request names, or "" when it parses.
std::string error_param(const ojson& tools, const ojson& choice = nullptr) {
  try {
    parse_tools(tools, choice);
  } catch (const ToolRequestError& e) {
    return e.param();
  }
  return "";
}

TEST(ToolCallsTest, ParsesToolsAndChoice) {
  const Tools t = weather();
  ASSERT_EQ(t.functions.size(), 2u);
  EXPECT_EQ(t.functions[0].name, "get_weather");
  EXPECT_EQ(t.functions[0].parameters["required"], ojson::array({"city"}));
  EXPECT_EQ(t.functions[1].parameters, ojson::object());  // no parameters: any object
  EXPECT_EQ(t.choice, Tools::Choice::automatic);
  EXPECT_TRUE(t.active());
  EXPECT_FALSE(t.forced());
  EXPECT_FALSE(weather("none").active());
  EXPECT_TRUE(weather("required").forced());
  const Tools named =
      weather(ojson::parse(R"({"type":"function","function":{"name":"get_time"}})"));
  EXPECT_EQ(named.choice, Tools::Choice::function);
  EXPECT_EQ(named.forced_name, "get_time");
  EXPECT_FALSE(parse_tools(nullptr, nullptr).active());
  EXPECT_FALSE(parse_tools(ojson::array(), "auto").active());
  EXPECT_FALSE(parse_tools(kWeather, nullptr, false).parallel);
}

TEST(ToolCallsTest, BadToolsNameTheField) {
  EXPECT_EQ(error_param(ojson::parse(R"([{"type": "retrieval"}])")), "tools[0].type");
  EXPECT_EQ(error_param(ojson::parse(R"([{"type": "function"}])")), "tools[0].function");
  EXPECT_EQ(error_param(ojson::parse(R"([{"type": "function", "function": {}}])")),
            "tools[0].function.name");
  EXPECT_EQ(error_param(ojson::parse(R"([{"type": "function", "function": {"name": "a b"}}])")),
            "tools[0].function.name");
  EXPECT_EQ(error_param(json::parse(
                R"([{"type": "function", "function": {"name": "f", "parameters": "x"}}])")),
            "tools[0].function.parameters");
  EXPECT_EQ(error_param(ojson::parse(R"([{"type":"function","function":{"name":"f"}},
                                        {"type":"function","function":{"name":"f"}}])")),
            "tools[1].function.name");
  EXPECT_EQ(error_param(ojson::object()), "tools");
  EXPECT_EQ(error_param(kWeather, "sometimes"), "tool_choice");
  EXPECT_EQ(error_param(nullptr, "required"), "tool_choice");
  EXPECT_EQ(
      error_param(kWeather, ojson::parse(R"({"type":"function","function":{"name":"nope"}})")),
      "tool_choice.function.name");
  EXPECT_EQ(error_param(kWeather), "");
}

TEST(ToolCallsTest, MessageToolCallsAcceptTextOrObjectArguments) {
  const auto calls = parse_tool_calls(json::parse(R"([
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
      {"id": "c2", "function": {"name": "g", "arguments": {"b": 2}}}])"),
                                      "messages[1].tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(calls[1].arguments, "{\"b\":2}");
  try {
    parse_tool_calls(json::parse(R"([{"id": "c1"}])"), "messages[1].tool_calls");
    FAIL();
  } catch (const ToolRequestError& e) {
    EXPECT_EQ(e.param(), "messages[1].tool_calls[0].function");
  }
  EXPECT_THROW(parse_tool_calls(json::parse(R"([{"id": "c", "function": {"name": "f",
      "arguments": "not json"}}])"),
                                "m"),
               ToolRequestError);
}

TEST(ToolCallsTest, ForcedCallSchema) {
  const ojson one = call_schema(
      weather(ojson::parse(R"({"type":"function","function":{"name":"get_weather"}})")));
  EXPECT_EQ(one["properties"]["name"]["const"], "get_weather");
  // The parameters, made a schema resource of their own (their "#..." refs mean them).
  ojson arguments = kWeather[0]["function"]["parameters"];
  arguments["$id"] = "urn:edgellm:tool:get_weather";
  EXPECT_EQ(one["properties"]["arguments"], arguments);
  EXPECT_EQ(one["required"], ojson::array({"name", "arguments"}));
  EXPECT_EQ(one["properties"].begin().key(), "name");  // the name first, then the arguments
  const ojson any = call_schema(weather("required"));
  ASSERT_EQ(any["anyOf"].size(), 2u);
  EXPECT_EQ(any["anyOf"][1]["properties"]["name"]["const"], "get_time");
}

TEST(ToolCallsTest, RendersToolsIntoTheSystemTurnKeepingTheDefault) {
  const ChatTemplate ct = ChatTemplate::from_text(kSmolTemplate, "", "test");
  const std::vector<ChatMessage> msgs{{"user", "Weather in Paris?"}};
  const auto turns = tool_conversation(ct, msgs, weather());
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0].role, "system");
  EXPECT_TRUE(turns[0].content.starts_with("You are a helpful AI assistant named SmolLM"));
  EXPECT_NE(turns[0].content.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":"
                                  "\"get_weather\",\"description\":\"Current weather\","
                                  "\"parameters\":{\"type\":\"object\",\"properties\""),
            std::string::npos)
      << turns[0].content;
  EXPECT_NE(turns[0].content.find("<tool_call>"), std::string::npos);
  // A system message of the request gets the block appended.
  const std::vector<ChatMessage> sys{{"system", "Be brief."}, {"user", "Hi"}};
  const auto with_sys = tool_conversation(ct, sys, weather());
  ASSERT_EQ(with_sys.size(), 2u);
  EXPECT_TRUE(with_sys[0].content.starts_with("Be brief.\n\n# Tools"));
  // tool_choice none: the conversation as it is.
  const auto none = tool_conversation(ct, msgs, weather("none"));
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].content, "Weather in Paris?");
}

TEST(ToolCallsTest, RendersCallsAndResults) {
  const ChatTemplate ct = ChatTemplate::from_text(kSmolTemplate, "", "test");
  std::vector<ChatMessage> msgs{{"user", "Weather?"}, {"assistant", ""}, {"tool", "sunny"}};
  msgs[1].tool_calls = {{"c1", "get_weather", "{\"city\": \"Paris\"}"}};
  const auto turns = tool_conversation(ct, msgs, Tools{});
  EXPECT_EQ(ct.render(turns, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n"
            "</tool_call><|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n");
  // Gemma alternates user/model: the result becomes a user turn.
  const ChatTemplate gemma = ChatTemplate::from_text(
      "{% if false %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
      "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}{% endfor %}",
      "<bos>", "g");
  const auto g = tool_conversation(gemma, msgs, Tools{});
  EXPECT_EQ(g[2].role, "user");
  EXPECT_EQ(g[2].content, "<tool_response>\nsunny\n</tool_response>");
  EXPECT_NO_THROW(gemma.render(g, true));
}

// A template that renders tools gets them, the calls and the results as
// transformers passes them, and a forced reply opens with its own call tag.
TEST(ToolCallsTest, TemplateThatRendersToolsGetsThemNatively) {
  const ChatTemplate qwen = ChatTemplate::from_text(
      "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      "{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} "
      "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
      "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}",
      "", "q");
  ASSERT_TRUE(qwen.renders_tools());
  std::vector<ChatMessage> msgs{{"user", "Weather?"}, {"assistant", ""}, {"tool", "sunny"}};
  msgs[1].tool_calls = {{"c1", "get_weather", "{\"city\": \"Paris\"}"}};
  msgs[2].tool_call_id = "c1";
  const Tools tools = weather("required");
  const std::string text = render_conversation(qwen, msgs, false, tools);
  EXPECT_TRUE(
      text.starts_with("<tools>{\"type\": \"function\", \"function\": {\"name\": "
                       "\"get_weather\", \"description\": \"Current weather\", "
                       "\"parameters\": {\"type\": \"object\""))
      << text;
  EXPECT_NE(text.find("{\"type\": \"function\", \"function\": {\"name\": \"get_time\""),
            std::string::npos);
  EXPECT_NE(text.find("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
                      "<tool_call>get_weather {\"city\": \"Paris\"}</tool_call><|im_end|>\n"
                      "<|im_start|>tool\nsunny(c1)<|im_end|>\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(forced_call_prefix(qwen), "<tool_call>\n");
  const ChatTemplate mistral = ChatTemplate::from_text(
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}[TOOL_CALLS]{% endif %}", "",
      "m");
  EXPECT_EQ(forced_call_prefix(mistral), "[TOOL_CALLS]");
  const ChatTemplate llama = ChatTemplate::from_text("{{ tools | tojson }}", "", "l");
  EXPECT_EQ(forced_call_prefix(llama), "");
  // One that does not render tools gets our Hermes layout and its tag.
  EXPECT_EQ(forced_call_prefix(ChatTemplate::from_text(kSmolTemplate, "", "s")), "<tool_call>\n");
}

TEST(ToolCallsTest, ParsesTaggedAndBareCalls) {
  const Tools t = weather();
  ToolReply r = parse_tool_output(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>",
      t);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_TRUE(r.calls[0].id.starts_with("call_"));
  EXPECT_EQ(r.content, "");
  // Arguments as a JSON string, text before the call, no tags.
  r = parse_tool_output(
      "Let me check.\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}",
      t);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["city"], "Rome");
  EXPECT_EQ(r.content, "Let me check.");
  // A list of calls inside one tag (SmolLM2's format); "parameters" for "arguments".
  r = parse_tool_output(
      "<tool_call>[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", "
      "\"parameters\": {\"city\": \"Oslo\"}}]</tool_call>",
      t);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "get_weather");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  EXPECT_EQ(parse_tool_output("[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": "
                              "\"get_time\", \"arguments\": {}}]",
                              parse_tools(kWeather, nullptr, false))
                .calls.size(),
            1u);  // parallel_tool_calls false: the first call only
  // Mistral's [TOOL_CALLS] list and Llama 3.1's <|python_tag|> before a bare call.
  r = parse_tool_output(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}]", t);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["city"], "Bern");
  EXPECT_EQ(r.content, "");
  r = parse_tool_output(
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Riga\"}}", t);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["city"], "Riga");
}

TEST(ToolCallsTest, AnythingElseIsPlainContent) {
  const Tools t = weather();
  for (const char* text : {
           "The weather is nice.",
           "{\"name\": \"unknown_fn\", \"arguments\": {}}",           // not one of the tools
           "{\"name\": \"get_weather\", \"arguments\": {\"city\": ",  // malformed (cut off)
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": 3}</tool_call>",
           "{\"name\": \"get_weather\", \"arguments\": \"not json\"}",
           "{\"city\": \"Paris\"}",  // JSON, but no call
           "{\"name\": \"get_weather\"} and then more text",
       }) {
    const std::string padded = std::string("  ") + text + "\n";
    const ToolReply r = parse_tool_output(padded, t);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, padded);  // as generated
  }
  // No tools (or tool_choice none): never a call.
  EXPECT_TRUE(parse_tool_output("{\"name\": \"get_weather\", \"arguments\": {}}", weather("none"))
                  .calls.empty());
}

TEST(ToolCallsTest, ForcedReplyIsTheJsonAfterThePromptsTag) {
  const Tools t = weather("required");
  const ToolReply r =
      parse_tool_output("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", t);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  const ToolReply closed =
      parse_tool_output("{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", t);
  ASSERT_EQ(closed.calls.size(), 1u);
  EXPECT_EQ(closed.content, "");
}

// A forced call's $ref resolves against the tool's own parameters (JSON
// Schema's embedded resource), for a named function and for "required" alike.
bool call_accepts(const Tools& tools, std::string_view call) {
  JsonMatcher m(call_grammar(tools));
  return m.accept(call) && m.complete();
}

Tools one_tool(const std::string& parameters, const ojson& choice = "required") {
  return parse_tools(
      ojson::array({{{"type", "function"},
                     {"function",
                      {{"name", "f"}, {"parameters", parse_ordered_json(parameters, "test")}}}}}),
      choice);
}

TEST(ToolCallsTest, RefsResolveInsideTheToolsParameters) {
  const char* city = R"({"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
      "required": ["city"], "$defs": {"City": {"type": "object",
      "properties": {"name": {"type": "string"}}, "required": ["name"]}}})";
  const ojson named = ojson::parse(R"({"type":"function","function":{"name":"f"}})");
  for (const ojson& choice : {ojson("required"), named}) {
    const Tools t = one_tool(city, choice);
    EXPECT_TRUE(call_accepts(t, R"({"name":"f","arguments":{"city":{"name":"Paris"}}})"));
    EXPECT_FALSE(call_accepts(t, R"({"name":"f","arguments":{"city":"Paris"}})"));
    EXPECT_FALSE(call_accepts(t, R"({"name":"f","arguments":{"city":{}}})"));
  }
  // "#" is the parameters, not the call around them: recursion nests arguments, never calls.
  const Tools tree = one_tool(R"({"type": "object", "properties": {"v": {"type": "integer"},
      "child": {"$ref": "#"}}})");
  EXPECT_TRUE(call_accepts(tree, R"({"name":"f","arguments":{"v":1,"child":{"child":{"v":2}}}})"));
  EXPECT_FALSE(
      call_accepts(tree, R"({"name":"f","arguments":{"child":{"name":"f","arguments":{}}}})"));
  // The wrapper is not the tool's document: its "name" is out of reach.
  try {
    call_grammar(
        one_tool(R"({"type": "object", "properties": {"x": {"$ref": "#/properties/name"}}})"));
    FAIL() << "a reference into the wrapper compiled";
  } catch (const ToolRequestError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_NE(std::string(e.what()).find("'#/properties/name' does not resolve"), std::string::npos)
        << e.what();
  }
  // Two tools, one name for different definitions: each sees its own.
  const Tools two = parse_tools(ojson::parse(R"([
      {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
       "properties": {"x": {"$ref": "#/$defs/T"}}, "required": ["x"],
       "$defs": {"T": {"type": "integer"}}}}},
      {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
       "properties": {"x": {"$ref": "#/$defs/T"}}, "required": ["x"],
       "$defs": {"T": {"type": "string"}}}}}])"),
                                "required");
  EXPECT_TRUE(call_accepts(two, R"({"name":"a","arguments":{"x":1}})"));
  EXPECT_TRUE(call_accepts(two, R"({"name":"b","arguments":{"x":"s"}})"));
  EXPECT_FALSE(call_accepts(two, R"({"name":"a","arguments":{"x":"s"}})"));
  EXPECT_FALSE(call_accepts(two, R"({"name":"b","arguments":{"x":1}})"));
}

TEST(ToolCallsTest, HostileParametersAreARequestErrorNamingThem) {
  std::string defs;
  for (int i = 0; i < 12'000; ++i)
    defs +=
        "\"d" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) + "\"}, ";
  const Tools chain = one_tool(R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}},
      "$defs": {)" + defs + R"("d12000": {}}})");
  try {
    call_grammar(chain);
    FAIL();
  } catch (const ToolRequestError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_NE(std::string(e.what()).find("1000 $ref hops"), std::string::npos) << e.what();
  }
  try {
    call_grammar(one_tool(R"({"type": "object", "properties": {"n": {"type": "integer",
        "minimum": 1e16}}})"));
    FAIL();
  } catch (const ToolRequestError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_NE(std::string(e.what()).find("'minimum'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace edgellm
