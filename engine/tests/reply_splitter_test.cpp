// A chat reply read the one way its template writes it (edgellm/reply_splitter.h),
// from the token ids a model samples: under a harmony template chat_reasoning
// asks generation to keep the special tokens (harmony's markers), and the
// ReplySplitter it chooses reads analysis as reasoning, final as content and a
// message to functions.NAME as a call; <|return|> and <|call|> stop without
// text. A grammar binds only to the final body, and a budget forces it in.
// Other templates keep today's text and splitting.
#include "edgellm/reply_splitter.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "edgellm/json_grammar.h"
#include "test_util.h"

namespace edgellm {
namespace {

// Every printable ASCII byte and "\n" is a token; harmony's markers are
// special tokens of their own, as in gpt-oss, and so is <|other|>, which is
// not one; <|return|> and <|call|> end a reply (gpt-oss's EOS ids).
struct HarmonyVocab {
  std::vector<std::string> pieces;
  Tokenizer tokenizer;
  ModelConfig config;

  HarmonyVocab() : tokenizer(make()) {
    config.vocab_size = static_cast<int>(pieces.size());
    config.eos_token_ids = {id("<|return|>"), id("<|call|>")};
  }
  int32_t id(std::string_view piece) const {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i] == piece) return static_cast<int32_t>(i);
    ADD_FAILURE() << "no piece " << piece;
    return -1;
  }
  std::vector<float> favour(int32_t best, int32_t second = -1) const {
    std::vector<float> logits(pieces.size(), 0.0f);
    logits[static_cast<size_t>(best)] = 5.0f;
    if (second >= 0) logits[static_cast<size_t>(second)] = 4.0f;
    return logits;
  }

 private:
  Tokenizer make() {
    pieces.emplace_back("\n");
    for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(1, c);
    const std::vector<std::string> markers = {"<|start|>",     "<|channel|>", "<|message|>",
                                              "<|constrain|>", "<|end|>",     "<|return|>",
                                              "<|call|>",      "<|other|>"};
    std::vector<std::pair<std::string, bool>> added;
    for (const std::string& m : markers) added.emplace_back(m, true);
    const nlohmann::json tok = testing::piece_tokenizer_json(pieces, added);
    pieces.insert(pieces.end(), markers.begin(), markers.end());
    const auto dir = testing::make_temp_dir("reply_splitter");
    testing::write_text(dir / "tokenizer.json", tok.dump());
    return Tokenizer::load(dir);
  }
};

// gpt-oss's shape: its generation prompt ends with "<|start|>assistant".
const ChatTemplate kHarmony = ChatTemplate::from_text(
    "{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final"
    "{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant",
    "", "harmony");
const ChatTemplate kPlain = ChatTemplate::from_text(
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "<|start|>assistant<|message|>",
    "", "plain");

const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");

struct Reply {
  std::string text, reasoning, content;
  std::optional<ToolReply> end;
  FinishReason finish = FinishReason::none;
};

// Samples `reply`'s tokens (its special-token text read as those tokens) one
// by one, streaming each step's text into the ReplySplitter the options choose.
Reply run(const HarmonyVocab& v, const GenerateOptions& o, std::string_view reply,
          const Tools& tools = {}) {
  Generation gen(v.tokenizer, v.config, o);
  ReplySplitter split(o.reasoning);
  Reply out;
  std::string held;
  for (int32_t token : v.tokenizer.encode(reply)) {
    if (gen.done()) break;
    const Generation::Step s = gen.next(v.favour(token));
    ReasoningSplitter::Piece p = split.feed(s.text);
    out.reasoning += p.reasoning;
    (split.holds_content(tools) ? held : out.content) += p.content;
  }
  if (!gen.done()) gen.finish(FinishReason::length);
  ReasoningSplitter::Piece p = split.feed("", /*last=*/true);
  out.reasoning += p.reasoning;
  (split.holds_content(tools) ? held : out.content) += p.content;
  out.end = split.end(held, tools);
  out.text = gen.text();
  out.finish = gen.finish_reason();
  return out;
}

GenerateOptions chat_options(const HarmonyVocab& v, const ChatTemplate& chat,
                             std::string_view prompt =
                                 "<|start|>user<|message|>Hi<|end|>"
                                 "<|start|>assistant",
                             int budget = -1) {
  GenerateOptions o;
  o.max_tokens = 200;
  o.sampling.temperature = 0.0f;
  o.reasoning = chat_reasoning(v.tokenizer, chat, v.tokenizer.encode(prompt), false, budget);
  return o;
}

constexpr std::string_view kAnalysisThenFinal =
    "<|channel|>analysis<|message|>Think.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello<|other|>!<|return|>";

TEST(ReplySplitter, AHarmonyReplyKeepsItsMarkersAndSplitsByChannel) {
  const HarmonyVocab v;
  const GenerateOptions o = chat_options(v, kHarmony);
  ASSERT_TRUE(o.reasoning.enabled && o.reasoning.harmony && !o.reasoning.started);
  const Reply r = run(v, o, kAnalysisThenFinal);
  // The text keeps the markers, not other special tokens; <|return|> stops the
  // reply and is not in it.
  EXPECT_EQ(r.text,
            "<|channel|>analysis<|message|>Think.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello!");
  EXPECT_EQ(r.finish, FinishReason::stop);
  EXPECT_EQ(r.reasoning, "Think.");
  EXPECT_EQ(r.content, "Hello!");
  ASSERT_TRUE(r.end);  // harmony reads its end for calls, with or without tools: none here
  EXPECT_EQ(r.end->content, "");
  EXPECT_TRUE(r.end->calls.empty());
}

TEST(ReplySplitter, AHarmonyCallBecomesAToolCallAndOnlyTheCallWaits) {
  const HarmonyVocab v;
  const Tools tools = parse_tools(kTools, nullptr);
  const std::string reply =
      "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>final"
      "<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
  const Reply r = run(v, chat_options(v, kHarmony), reply, tools);
  EXPECT_EQ(r.finish, FinishReason::stop);  // <|call|> ends it
  EXPECT_EQ(r.reasoning, "Weather.");
  EXPECT_EQ(r.content, "Checking.");  // streamed as it came, not held for the calls
  ASSERT_TRUE(r.end);
  EXPECT_EQ(r.end->content, "");
  ASSERT_EQ(r.end->calls.size(), 1u);
  EXPECT_EQ(r.end->calls[0].name, "get_weather");
  EXPECT_EQ(r.end->calls[0].arguments, "{\"city\":\"Paris\"}");

  // Without active tools the call's body is content, as a think template's would be.
  const Reply no_tools = run(v, chat_options(v, kHarmony), reply);
  ASSERT_TRUE(no_tools.end);
  EXPECT_EQ(no_tools.content, "Checking.");
  EXPECT_EQ(no_tools.end->content, "{\"city\": \"Paris\"}");
  EXPECT_TRUE(no_tools.end->calls.empty());
}

TEST(ReplySplitter, OtherTemplatesKeepTodaysTextAndSplitting) {
  const HarmonyVocab v;
  const GenerateOptions o = chat_options(v, kPlain);
  EXPECT_FALSE(o.reasoning.enabled || o.reasoning.harmony);
  const Reply r = run(v, o, kAnalysisThenFinal);
  // Special tokens dropped from the text (HF's skip_special_tokens), all of it content.
  EXPECT_EQ(r.text, "analysisThink.assistantfinalHello!");
  EXPECT_EQ(r.content, r.text);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_FALSE(r.end);  // no tools: nothing read at the end

  // With active tools a plain reply is held and parsed for calls whole.
  const Tools tools = parse_tools(kTools, nullptr);
  const Reply held = run(v, o, "Sunny.", tools);
  EXPECT_EQ(held.content, "");
  ASSERT_TRUE(held.end);
  EXPECT_EQ(held.end->content, "Sunny.");

  // A forced call answers at once, under its grammar: no harmony rules.
  EXPECT_FALSE(chat_reasoning(v.tokenizer, kHarmony, v.tokenizer.encode("<|start|>assistant"),
                              /*forced_call=*/true, -1)
                   .enabled);
}

TEST(ReplySplitter, TheGrammarBindsOnlyToTheFinalBody) {
  const HarmonyVocab v;
  GenerateOptions o = chat_options(v, kHarmony);
  o.grammar = compile_json_schema(R"({"type": "integer"})");
  Generation gen(v.tokenizer, v.config, o);
  for (int32_t t : v.tokenizer.encode("<|channel|>analysis<|message|>a{ b<|end|><|start|>assistant"
                                      "<|channel|>commentary<|message|>x<|end|><|start|>assistant"
                                      "<|channel|>final<|message|>"))
    gen.next(v.favour(t));  // free before the final body
  for (int i = 0; i < 3; ++i) gen.next(v.favour(v.id("a"), v.id("7")));
  gen.next(v.favour(v.id("<|return|>")));
  EXPECT_EQ(gen.text(),
            "<|channel|>analysis<|message|>a{ b<|end|><|start|>assistant<|channel|>commentary"
            "<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>777");
  EXPECT_EQ(gen.finish_reason(), FinishReason::stop);
}

TEST(ReplySplitter, ABudgetForcesTheFinalBodyIn) {
  const HarmonyVocab v;
  // Budget 0 before any text: the final header at once.
  Generation none(v.tokenizer, v.config,
                  chat_options(v, kHarmony, "<|start|>assistant", /*budget=*/0));
  for (int i = 0; i < 8; ++i) none.next(v.favour(v.id("a")));  // 7 forced, then the model's
  EXPECT_EQ(none.text(), "<|channel|>final<|message|>a");

  // A prompt that opened the analysis body: it is the reasoning, closed after 2 tokens.
  const std::string opened = "<|start|>assistant<|channel|>analysis<|message|>";
  GenerateOptions o = chat_options(v, kHarmony, opened, /*budget=*/2);
  ASSERT_TRUE(o.reasoning.started);
  const Reply r = run(v, o, "abcdefghijklmnopqrstuvwxyz0123456789");
  // The close's 18 tokens took the place of "c".."t".
  EXPECT_EQ(r.text, "ab<|end|><|start|>assistant<|channel|>final<|message|>uvwxyz0123456789");
  EXPECT_EQ(r.reasoning, "ab");
  EXPECT_EQ(r.content, "uvwxyz0123456789");

  // Reached inside a header, the close waits for the body.
  Generation header(v.tokenizer, v.config,
                    chat_options(v, kHarmony, "<|start|>assistant", /*budget=*/1));
  for (int32_t t : v.tokenizer.encode("<|channel|>analysis<|message|>")) header.next(v.favour(t));
  for (int i = 0; i < 20; ++i) header.next(v.favour(v.id("x")));  // 18 forced, then the model's
  EXPECT_EQ(header.text(),
            "<|channel|>analysis<|message|><|end|><|start|>assistant"
            "<|channel|>final<|message|>xx");
}

TEST(ReplySplitter, ThePromptOpensAnAnalysisBodyOnlyWhenItEndsInOne) {
  EXPECT_TRUE(
      harmony_analysis_open("<|start|>user<|message|>Hi<|end|><|start|>assistant"
                            "<|channel|>analysis<|message|>"));
  EXPECT_TRUE(harmony_analysis_open("<|start|>assistant<|channel|>analysis<|message|>Let me"));
  EXPECT_FALSE(harmony_analysis_open("<|start|>assistant"));
  EXPECT_FALSE(harmony_analysis_open("<|start|>assistant<|channel|>analysis<|message|>x<|end|>"));
  EXPECT_FALSE(harmony_analysis_open("<|start|>assistant<|channel|>final<|message|>"));
  EXPECT_EQ(harmony_body_after("a<|message|>b"), std::optional<bool>(true));
  EXPECT_EQ(harmony_body_after("<|message|>b<|end|><|start|>x"), std::optional<bool>(false));
  EXPECT_EQ(harmony_body_after("plain"), std::nullopt);
}

}  // namespace
}  // namespace edgellm
