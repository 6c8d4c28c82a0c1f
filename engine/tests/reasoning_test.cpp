// Reasoning blocks: the splitter gives the same two parts however the reply is
// streamed; a Generation leaves the block free and binds the grammar after it
// (also when the reply opens the block itself), and a budget forces the close.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "edgellm/generate.h"
#include "edgellm/json_grammar.h"
#include "edgellm/reasoning.h"
#include "test_util.h"

namespace edgellm {
namespace {

using Parts = std::pair<std::string, std::string>;  // reasoning, content

Parts split(bool started, std::string_view reply, size_t piece) {
  ReasoningSplitter s(started);
  Parts out;
  const auto add = [&](const ReasoningSplitter::Piece& p) {
    out.first += p.reasoning;
    out.second += p.content;
  };
  for (size_t i = 0; i < reply.size(); i += piece) add(s.feed(reply.substr(i, piece)));
  add(s.feed("", /*last=*/true));
  return out;
}

TEST(Reasoning, SplitterGivesTheSamePartsHoweverTheReplyStreams) {
  struct Case {
    bool started;
    std::string reply;
    Parts want;
  };
  const std::vector<Case> cases = {
      {false, "<think>\nabc\n</think>\n\nHello", {"abc\n", "Hello"}},
      {false, "\n <think>x</think>y", {"x", "y"}},
      {false, "  Hello <think>", {"", "Hello <think>"}},
      {false, "<thi", {"", "<thi"}},
      {false, "<thinking>", {"", "<thinking>"}},
      {false, "", {"", ""}},
      {true, "\nabc</think>answer </think>", {"abc", "answer </think>"}},
      {true, "abc </thi", {"abc </thi", ""}},  // cut off inside the block
      {true, "</think>\n\n{\"a\": 1}", {"", "{\"a\": 1}"}},
  };
  for (const Case& c : cases)
    for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{1000}})
      EXPECT_EQ(split(c.started, c.reply, piece), c.want)
          << "reply '" << c.reply << "' in pieces of " << piece;
}

TEST(Reasoning, ThePromptsLastMarkerSaysWhetherTheBlockIsOpen) {
  EXPECT_TRUE(reasoning_started("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(reasoning_started("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(reasoning_started("<|im_start|>assistant\n"));
  EXPECT_TRUE(reasoning_started("<think>a</think> then <think>"));
}

// Every printable ASCII byte and "\n" is a token; <think> and </think> are
// added tokens of their own (as in Qwen3); </s> is the EOS.
struct Vocab {
  std::vector<std::string> pieces;
  int32_t open = -1, close = -1, eos = -1;
  Tokenizer tokenizer;
  ModelConfig config;

  Vocab() : tokenizer(make()) {
    config.vocab_size = eos + 1;
    config.eos_token_ids = {eos};
  }
  int32_t id(std::string_view piece) const {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i] == piece) return static_cast<int32_t>(i);
    ADD_FAILURE() << "no piece " << piece;
    return -1;
  }
  // Logits that favour `best`, then `second`.
  std::vector<float> favour(int32_t best, int32_t second = -1) const {
    std::vector<float> logits(static_cast<size_t>(config.vocab_size), 0.0f);
    logits[static_cast<size_t>(best)] = 5.0f;
    if (second >= 0) logits[static_cast<size_t>(second)] = 4.0f;
    return logits;
  }

 private:
  Tokenizer make() {
    pieces.emplace_back("\n");
    for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(1, c);
    open = static_cast<int32_t>(pieces.size());
    close = open + 1;
    eos = open + 2;
    const nlohmann::json tok = testing::piece_tokenizer_json(
        pieces, {{"<think>", false}, {"</think>", false}, {"</s>", true}});
    pieces.insert(pieces.end(), {"<think>", "</think>", "</s>"});
    const auto dir = testing::make_temp_dir("reasoning");
    testing::write_text(dir / "tokenizer.json", tok.dump());
    return Tokenizer::load(dir);
  }
};

GenerateOptions reasoning_options(bool started, int budget = -1) {
  GenerateOptions o;
  o.max_tokens = 40;
  o.sampling.temperature = 0.0f;
  o.grammar = compile_json_schema(R"({"type": "integer"})");
  o.reasoning = {.enabled = true, .started = started, .budget = budget};
  return o;
}

TEST(Reasoning, TheGrammarBindsOnlyAfterTheBlock) {
  const Vocab v;
  ASSERT_EQ(v.tokenizer.encode(kThinkClose), std::vector<int32_t>{v.close});
  Generation gen(v.tokenizer, v.config, reasoning_options(/*started=*/true));
  for (const char* t : {"a", "{", " ", "b"}) gen.next(v.favour(v.id(t)));  // free inside
  gen.next(v.favour(v.close));
  for (int i = 0; i < 3 && !gen.done(); ++i) gen.next(v.favour(v.id("a"), v.id("7")));
  gen.next(v.favour(v.eos));
  EXPECT_EQ(gen.text(), "a{ b</think>777");  // after the close only digits were allowed
  EXPECT_EQ(gen.finish_reason(), FinishReason::stop);

  // Without reasoning the same grammar binds from the first token.
  GenerateOptions plain = reasoning_options(true);
  plain.reasoning = {};
  Generation bound(v.tokenizer, v.config, plain);
  bound.next(v.favour(v.id("a"), v.id("7")));
  EXPECT_EQ(bound.text(), "7");
}

TEST(Reasoning, AReplyMayOpenTheBlockWithItsToken) {
  const Vocab v;
  Generation opens(v.tokenizer, v.config, reasoning_options(/*started=*/false));
  opens.next(v.favour(v.open));  // allowed beside the grammar's first tokens
  opens.next(v.favour(v.id("x")));
  opens.next(v.favour(v.close));
  opens.next(v.favour(v.id("a"), v.id("5")));
  EXPECT_EQ(opens.text(), "<think>x</think>5");

  Generation answers(v.tokenizer, v.config, reasoning_options(/*started=*/false));
  answers.next(v.favour(v.id("x"), v.id("4")));  // no block: the grammar's from the start
  answers.next(v.favour(v.open, v.id("2")));     // and never again the opening token
  EXPECT_EQ(answers.text(), "42");
}

TEST(Reasoning, ABudgetForcesTheClose) {
  const Vocab v;
  Generation gen(v.tokenizer, v.config, reasoning_options(/*started=*/true, /*budget=*/3));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 6 && !gen.done(); ++i)
    tokens.push_back(gen.next(v.favour(v.id("a"), v.id("9"))).token);
  EXPECT_EQ(tokens,
            (std::vector<int32_t>{v.id("a"), v.id("a"), v.id("a"), v.close, v.id("9"), v.id("9")}));

  // Without a grammar the opening is read off the text, here one byte at a time.
  GenerateOptions o = reasoning_options(/*started=*/false, /*budget=*/2);
  o.grammar = nullptr;
  Generation text(v.tokenizer, v.config, o);
  for (const char* t : {" ", "<", "t", "h", "i", "n", "k", ">", "q", "r", "s", "s"})
    text.next(v.favour(v.id(t)));
  EXPECT_EQ(text.text(), " <think>qr</think>s");  // the forced close took one step

  // Budget 0: the block is closed at once.
  Generation none(v.tokenizer, v.config, reasoning_options(/*started=*/true, /*budget=*/0));
  none.next(v.favour(v.id("a"), v.id("1")));
  none.next(v.favour(v.id("a"), v.id("1")));
  EXPECT_EQ(none.text(), "</think>1");
}

}  // namespace
}  // namespace edgellm
