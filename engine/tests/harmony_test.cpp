// gpt-oss's harmony replies: the splitter gives the same reasoning, content and
// calls however the reply streams, fails closed on what is not a header, and
// the calls become ToolCalls only for active tools; other templates are not harmony.
#include "edgellm/harmony.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace edgellm {
namespace {

using ojson = nlohmann::ordered_json;

struct Parts {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // recipient, arguments
  bool operator==(const Parts&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Parts& p) {
  os << "{reasoning '" << p.reasoning << "', content '" << p.content << "', calls";
  for (const auto& [r, a] : p.calls) os << " " << r << ":'" << a << "'";
  return os << "}";
}

// The reply fed in `cuts` order (each a byte offset where a piece ends), then ended.
Parts feed(std::string_view reply, const std::vector<size_t>& cuts) {
  HarmonySplitter s;
  Parts out;
  const auto add = [&](const ReasoningSplitter::Piece& p) {
    out.reasoning += p.reasoning;
    out.content += p.content;
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    add(s.feed(reply.substr(at, cut - at)));
    at = cut;
  }
  add(s.feed(reply.substr(at), /*last=*/true));
  for (const HarmonyCall& c : s.calls()) out.calls.emplace_back(c.recipient, c.arguments);
  return out;
}

// Whole; in pieces of every size 1..N; and cut in two at every byte.
void expect_split(std::string_view reply, const Parts& want) {
  EXPECT_EQ(feed(reply, {}), want) << "reply '" << reply << "' whole";
  for (size_t piece = 1; piece <= reply.size(); ++piece) {
    std::vector<size_t> cuts;
    for (size_t c = piece; c < reply.size(); c += piece) cuts.push_back(c);
    EXPECT_EQ(feed(reply, cuts), want) << "reply '" << reply << "' in pieces of " << piece;
  }
  for (size_t cut = 0; cut <= reply.size(); ++cut)
    EXPECT_EQ(feed(reply, {cut}), want) << "reply '" << reply << "' cut at " << cut;
}

TEST(Harmony, ChannelsSplitTheSameHoweverTheReplyStreams) {
  expect_split("<|channel|>analysis<|message|>User greets.<|end|>", {"User greets.", "", {}});
  expect_split("<|channel|>analysis<|message|>Cut off while thinking",
               {"Cut off while thinking", "", {}});
  expect_split("<|channel|>final<|message|>Hello!<|return|>", {"", "Hello!", {}});
  expect_split("<|channel|>final<|message|>Hello!", {"", "Hello!", {}});
  expect_split(
      "<|channel|>analysis<|message|>User greets.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello <b>!",
      {"User greets.", "Hello <b>!", {}});
  // A preamble to the user (commentary without a recipient) is content.
  expect_split(
      "<|channel|>commentary<|message|>Checking.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Done.",
      {"", "Checking.Done.", {}});
  // Text that only looks like a marker's start stays in the body.
  expect_split("<|channel|>final<|message|>a <|en b <|", {"", "a <|en b <|", {}});
  expect_split("", {"", "", {}});
}

TEST(Harmony, CallsAreKeptApartWithOrWithoutAnalysis) {
  expect_split(
      "<|channel|>analysis<|message|>Need the weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\":\"Paris\"}<|call|>",
      {"Need the weather.", "", {{"functions.get_weather", "{\"city\":\"Paris\"}"}}});
  expect_split("<|channel|>commentary to=functions.f<|constrain|>json<|message|>{}",
               {"", "", {{"functions.f", "{}"}}});
  // The recipient after the role: first message (the prompt wrote "<|start|>assistant") and later.
  expect_split(" to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}",
               {"", "", {{"functions.get_weather", "{\"city\":\"Oslo\"}"}}});
  expect_split(
      "<|channel|>analysis<|message|>Two calls.<|end|>"
      "<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|>"
      "<|start|>assistant to=functions.b<|channel|>commentary json<|message|>{\"x\":1}",
      {"Two calls.", "", {{"functions.a", "{}"}, {"functions.b", "{\"x\":1}"}}});
}

TEST(Harmony, WhatIsNotProvablyAHeaderIsContentAsWritten) {
  // Not harmony at all.
  expect_split("Hello <|channel|>final<|message|>x",
               {"", "Hello <|channel|>final<|message|>x", {}});
  expect_split("<|chan", {"", "<|chan", {}});
  expect_split("<|channel|> <|message|>x", {"", "<|channel|> <|message|>x", {}});
  expect_split("<|start|>to=functions.a<|channel|>commentary<|message|>{}",
               {"", "<|start|>to=functions.a<|channel|>commentary<|message|>{}", {}});
  expect_split("<|channel|>final<|message|>A<|end|><|start|>assistant<|message|>B",
               {"", "A<|start|>assistant<|message|>B", {}});
  expect_split(" to", {"", " to", {}});
  // A header cut off, or with a word it cannot hold, or two channels: as written, to the end.
  expect_split("<|channel|>analysis", {"", "<|channel|>analysis", {}});
  expect_split("<|channel|>analysis junk!<|message|>x<|end|>",
               {"", "<|channel|>analysis junk!<|message|>x<|end|>", {}});
  expect_split("<|channel|>a<|channel|>b<|message|>x",
               {"", "<|channel|>a<|channel|>b<|message|>x", {}});
  expect_split("<|start|>user<|channel|>final<|message|>x",
               {"", "<|start|>user<|channel|>final<|message|>x", {}});
  expect_split("<|channel|>commentary to= json<|message|>{}",
               {"", "<|channel|>commentary to= json<|message|>{}", {}});
  expect_split("<|channel|>commentary to=functions.a to=functions.b<|message|>{}",
               {"", "<|channel|>commentary to=functions.a to=functions.b<|message|>{}", {}});
  // After a message, text that is no header.
  expect_split("<|channel|>final<|message|>A<|end|>oops <|end|>", {"", "Aoops <|end|>", {}});
  // A header past the bound is not one, and is not held past it.
  const std::string long_header = "<|channel|>" + std::string(kMaxHarmonyHeader, 'a');
  EXPECT_EQ(feed(long_header + "<|message|>x", {}), (Parts{"", long_header + "<|message|>x", {}}));
  HarmonySplitter s;
  EXPECT_EQ(s.feed(long_header).content, long_header);  // released before the reply ends
  HarmonySplitter t;
  EXPECT_EQ(t.feed("<|channel|>" + std::string(200, 'a')).content, "");  // may still be a header
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])");

TEST(Harmony, CallsToActiveFunctionsBecomeToolCalls) {
  const Tools tools = parse_tools(kTools, nullptr);
  const std::string call =
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Paris\"}<|call|>";
  HarmonyReply r =
      parse_harmony_reply("<|channel|>analysis<|message|>Weather.<|end|>" + call, tools);
  EXPECT_EQ(r.reasoning, "Weather.");
  EXPECT_EQ(r.reply.content, "");
  ASSERT_EQ(r.reply.calls.size(), 1u);
  EXPECT_EQ(r.reply.calls[0].name, "get_weather");
  EXPECT_EQ(r.reply.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_TRUE(r.reply.calls[0].id.starts_with("call_"));

  // Two calls; parallel_tool_calls false keeps the first.
  const std::string two =
      " to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>" + call;
  EXPECT_EQ(parse_harmony_reply(two, tools).reply.calls.size(), 2u);
  const Tools one = parse_tools(kTools, nullptr, false);
  r = parse_harmony_reply(two, one);
  ASSERT_EQ(r.reply.calls.size(), 1u);
  EXPECT_EQ(r.reply.calls[0].name, "get_time");
}

TEST(Harmony, WhatIsNotACallToAnActiveFunctionIsContent) {
  const Tools tools = parse_tools(kTools, nullptr);
  const auto content_of = [](std::string_view reply, const Tools& t) {
    const HarmonyReply r = parse_harmony_reply(reply, t);
    EXPECT_TRUE(r.reply.calls.empty()) << reply;
    return r.reply.content;
  };
  // An unknown function, a recipient outside functions., arguments that are no JSON object.
  EXPECT_EQ(content_of(" to=functions.nope<|channel|>commentary json<|message|>{}", tools), "{}");
  EXPECT_EQ(content_of(" to=assistant.get_time<|channel|>commentary json<|message|>{}", tools),
            "{}");
  EXPECT_EQ(content_of(" to=browser.search<|channel|>commentary json<|message|>{}", tools), "{}");
  EXPECT_EQ(content_of(" to=functions.get_time<|channel|>commentary json<|message|>{\"a\":", tools),
            "{\"a\":");
  EXPECT_EQ(content_of(" to=functions.get_time<|channel|>commentary json<|message|>[1]", tools),
            "[1]");
  // Tools off (tool_choice none) or none at all: no call.
  const std::string call = " to=functions.get_time<|channel|>commentary json<|message|>{}";
  EXPECT_EQ(content_of(call, parse_tools(kTools, "none")), "{}");
  EXPECT_EQ(content_of(call, Tools{}), "{}");
  // A final answer beside a bad call keeps both, in order.
  EXPECT_EQ(content_of("<|channel|>final<|message|>Hi.<|end|><|start|>assistant to=functions.x"
                       "<|channel|>commentary<|message|>{}",
                       tools),
            "Hi.{}");
}

TEST(Harmony, OnlyAChannelTemplateIsHarmony) {
  const ChatTemplate harmony = ChatTemplate::from_text(
      "{% for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}"
      "<|end|>{% endfor %}<|start|>assistant",
      "", "test");
  EXPECT_TRUE(harmony.harmony());
  EXPECT_FALSE(harmony.thinks());
  const ChatTemplate qwen = ChatTemplate::from_text(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n",
      "", "test");
  EXPECT_FALSE(qwen.harmony());
  EXPECT_TRUE(qwen.thinks());
}

}  // namespace
}  // namespace edgellm
