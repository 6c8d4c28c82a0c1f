// Generation's per-token rules on a 5-token vocabulary, driven by hand-made
// logits (greedy): stop strings across token boundaries are held back and
// cut, EOS and stop tokens end without output, max_tokens and cancel finish.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "test_util.h"

namespace edgellm {
namespace {

// Vocabulary a=0 b=1 c=2 x=3 and the special </s>=4; Fuse joins pieces as they are.
Tokenizer tiny_tokenizer() {
  const auto dir = testing::make_temp_dir("generate");
  testing::write_text(dir / "tokenizer.json", R"json({"version": "1.0",
    "added_tokens": [{"id": 4, "content": "</s>", "single_word": false, "lstrip": false,
      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Fuse"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
      "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
      "byte_fallback": false, "vocab": {"a": 0, "b": 1, "c": 2, "x": 3}, "merges": []}})json");
  return Tokenizer::load(dir);
}

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 5;
  c.eos_token_ids = {4};
  return c;
}

std::vector<float> pick(int32_t token) {
  std::vector<float> logits(5, 0.0f);
  logits[static_cast<size_t>(token)] = 1.0f;
  return logits;
}

// Runs the tokens through a Generation; returns each step's text ("|"-joined).
std::string steps(Generation& g, const std::vector<int32_t>& tokens) {
  std::string out;
  for (size_t i = 0; i < tokens.size() && !g.done(); ++i)
    out += (i ? "|" : "") + g.next(pick(tokens[i])).text;
  return out;
}

TEST(Generation, StopStringAcrossTokensIsHeldBackAndCut) {
  const Tokenizer tok = tiny_tokenizer();
  const ModelConfig cfg = tiny_config();
  GenerateOptions o;
  o.stop_strings = {"bc"};
  Generation g(tok, cfg, o);
  EXPECT_EQ(steps(g, {0, 1, 2, 0}), "a||");  // "b" held: it may start "bc"
  EXPECT_EQ(g.finish_reason(), FinishReason::stop);
  EXPECT_EQ(g.text(), "a");
  EXPECT_EQ(g.tokens().size(), 3u);
}

TEST(Generation, HeldTextIsReleasedWhenTheStopStringFails) {
  const Tokenizer tok = tiny_tokenizer();
  const ModelConfig cfg = tiny_config();
  GenerateOptions o;
  o.stop_strings = {"bx", "cc"};
  o.max_tokens = 4;
  Generation g(tok, cfg, o);
  EXPECT_EQ(steps(g, {0, 1, 2, 0}), "a||b|ca");  // "c" is held for "cc" in turn
  EXPECT_EQ(g.finish_reason(), FinishReason::length);
  EXPECT_EQ(g.text(), "abca");
}

TEST(Generation, EosAndStopTokensEndWithoutOutput) {
  const Tokenizer tok = tiny_tokenizer();
  const ModelConfig cfg = tiny_config();
  Generation eos(tok, cfg, {});
  EXPECT_EQ(steps(eos, {0, 4, 1}), "a|");
  EXPECT_EQ(eos.finish_reason(), FinishReason::stop);
  EXPECT_EQ(eos.tokens(), std::vector<int32_t>{0});

  GenerateOptions o;
  o.stop_tokens = {3};
  o.stop_at_eos = false;
  Generation stop(tok, cfg, o);
  EXPECT_EQ(steps(stop, {4, 3}), "|");  // </s> is plain output here; its text is skipped
  EXPECT_EQ(stop.tokens(), std::vector<int32_t>{4});
}

TEST(Generation, CancelAndFinishFlushTheHeldText) {
  const Tokenizer tok = tiny_tokenizer();
  const ModelConfig cfg = tiny_config();
  std::atomic<bool> cancel{false};
  GenerateOptions o;
  o.stop_strings = {"ab"};
  o.cancel = &cancel;
  Generation g(tok, cfg, o);
  EXPECT_EQ(g.next(pick(0)).text, "");  // "a" may start "ab"
  cancel = true;
  const Generation::Step s = g.next(pick(2));
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, "a");
  EXPECT_EQ(g.finish_reason(), FinishReason::cancelled);
  EXPECT_THROW(g.next(pick(0)), Error);
  EXPECT_THROW(Generation(tok, cfg, GenerateOptions{.max_tokens = 0}), Error);
}

}  // namespace
}  // namespace edgellm
