// Generation's per-token rules on a 5-token vocabulary, driven by hand-made
// logits (greedy): stop strings across token boundaries are held back and
// cut, EOS and stop tokens end without output (nor logprobs), max_tokens and
// cancel finish.
// Then generate() / Generator on a tiny random model: the same tokens as a
// hand-written prefill + decode_step loop, the per-sample hook, decoding past
// a stop (--ignore-eos), the callback's stop, the end of the context.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "test_util.h"
#include "tiny_model.h"

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
  for (size_t i = 0; i < tokens.size() && !g.done(); ++i) {
    if (i) out += "|";
    out += g.next(pick(tokens[i])).text;
  }
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

TEST(Generation, LogprobsComeWithOutputTokensOnly) {
  const Tokenizer tok = tiny_tokenizer();
  const ModelConfig cfg = tiny_config();
  GenerateOptions o;
  o.logprobs = 2;
  Generation g(tok, cfg, o);
  const Generation::Step a = g.next(pick(1));
  ASSERT_TRUE(a.logprobs.has_value());
  EXPECT_EQ(a.logprobs->chosen.token, 1);
  // softmax of {0, 1, 0, 0, 0}: e / (e + 4) for the chosen one.
  EXPECT_NEAR(a.logprobs->chosen.logprob, 1.0 - std::log(std::exp(1.0) + 4.0), 1e-6);
  ASSERT_EQ(a.logprobs->top.size(), 2u);
  EXPECT_EQ(a.logprobs->top[0].token, 1);
  EXPECT_FLOAT_EQ(a.logprobs->top[0].logprob, a.logprobs->chosen.logprob);
  const Generation::Step eos = g.next(pick(4));  // a stop token: not output, no logprobs
  EXPECT_TRUE(eos.done);
  EXPECT_FALSE(eos.logprobs.has_value());

  Generation off(tok, cfg, {});  // logprobs = -1: none
  EXPECT_FALSE(off.next(pick(0)).logprobs.has_value());
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
  GenerateOptions none;
  none.max_tokens = 0;
  EXPECT_THROW(Generation(tok, cfg, none), Error);
}

// ---- generate() over a real Context -------------------------------------------

// A Session on a tiny random Llama whose vocabulary is the test tokenizer's 26 ids.
Session tiny_session(int max_context = 64) {
  const testing::TinyModel m = testing::write_tiny_session_model(R"(, "vocab_size": 26)");
  Session s;
  SessionOptions o;
  o.threads = 2;
  o.max_context = max_context;
  s.setup(m.dir, o);
  return s;
}

const std::vector<int32_t> kPrompt = {24, 15, 7, 19};

// The seed's hand-written greedy loop: n sampled tokens, no stop rules.
std::vector<int32_t> hand_loop(Session& s, int n) {
  Sampler sampler({});
  std::vector<int32_t> out = {sampler.sample(s.prefill(kPrompt))};
  for (int pos = static_cast<int>(kPrompt.size()); static_cast<int>(out.size()) < n; ++pos)
    out.push_back(sampler.sample(s.decode_step(out.back(), pos)));
  return out;
}

TEST(Generate, MatchesTheHandLoopAndReportsEveryStep) {
  Session s = tiny_session();
  const std::vector<int32_t> expected = hand_loop(s, 10);
  GenerateOptions o;
  o.max_tokens = 10;
  o.stop_at_eos = false;
  o.lookup = false;  // one decode step per token, counted below
  std::vector<int32_t> sampled, streamed;
  size_t logits_seen = 0;
  o.on_sample = [&](std::span<const float> logits, int32_t token) {
    EXPECT_EQ(logits.size(), 26u);
    ++logits_seen;
    sampled.push_back(token);
  };
  const GenerateResult r = generate(s.context(), kPrompt, o, [&](int32_t token, std::string_view) {
    streamed.push_back(token);
    return true;
  });
  EXPECT_EQ(r.tokens, expected);
  EXPECT_EQ(sampled, expected);
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(logits_seen, 10u);
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_EQ(r.decode_steps, 9);  // the first token comes from the prefill
  EXPECT_EQ(r.end_pos, static_cast<int>(kPrompt.size()) + 9);
  EXPECT_EQ(r.prompt_tokens, kPrompt.size());
  EXPECT_GT(r.ttft_ms, 0.0);
}

TEST(Generate, DecodesPastAStopUnseenOnlyWhenAsked) {
  Session s = tiny_session();
  const std::vector<int32_t> expected = hand_loop(s, 12);
  // Stop at the first token that did not occur before it (from the third on).
  size_t k = 2;
  while (std::find(expected.begin(), expected.begin() + k, expected[k]) != expected.begin() + k)
    ++k;
  ASSERT_LT(k, expected.size() - 1) << "the tiny model repeats itself: pick another prompt";
  for (const bool past : {false, true}) {
    GenerateOptions o;
    o.max_tokens = 12;
    o.stop_tokens = {expected[k]};
    o.stop_at_eos = false;
    o.decode_past_stop = past;
    std::vector<int32_t> sampled, streamed;
    o.on_sample = [&](std::span<const float>, int32_t token) { sampled.push_back(token); };
    const GenerateResult r =
        generate(s.context(), kPrompt, o, [&](int32_t token, std::string_view) {
          streamed.push_back(token);
          return true;
        });
    EXPECT_EQ(r.finish, FinishReason::stop);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + k));
    // The callback sees the output and the stop step, never the unseen tokens.
    EXPECT_EQ(streamed, std::vector<int32_t>(expected.begin(), expected.begin() + k + 1));
    const size_t n = past ? 12 : k + 1;
    EXPECT_EQ(sampled, std::vector<int32_t>(expected.begin(), expected.begin() + n)) << past;
    EXPECT_EQ(r.decode_steps, static_cast<int>(n) - 1) << past;
  }
}

TEST(Generate, TheCallbackEndsItAndTheCacheSaysWhatRan) {
  Session s = tiny_session();
  const std::vector<int32_t> expected = hand_loop(s, 6);
  GenerateOptions o;
  o.max_tokens = 50;
  o.stop_at_eos = false;
  int calls = 0;
  const GenerateResult r =
      generate(s.context(), kPrompt, o, [&](int32_t, std::string_view) { return ++calls < 3; });
  EXPECT_EQ(r.finish, FinishReason::cancelled);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 3));
  EXPECT_EQ(r.end_pos, static_cast<int>(kPrompt.size()) + 2);  // the third token never ran
}

TEST(Generate, EndsAtTheEndOfTheContext) {
  Session s = tiny_session(/*max_context=*/9);
  GenerateOptions o;
  o.max_tokens = 50;
  o.stop_at_eos = false;
  o.decode_past_stop = true;  // no stop here: nothing to decode past
  const GenerateResult r = generate(s.context(), kPrompt, o);
  EXPECT_EQ(r.finish, FinishReason::length);
  EXPECT_EQ(r.end_pos, 9);
  EXPECT_EQ(r.tokens.size(), 9 - kPrompt.size() + 1);  // the last sampled token needs no slot
  EXPECT_EQ(r.decode_steps, 9 - static_cast<int>(kPrompt.size()));
}

TEST(Generate, ContinuesAConversationAtStartPos) {
  Session s = tiny_session();
  const std::vector<int32_t> expected = hand_loop(s, 8);
  // The prompt's first two tokens are already cached: prefill only the rest.
  Session t = tiny_session();
  t.prefill(std::span<const int32_t>(kPrompt.data(), 2));
  GenerateOptions o;
  o.max_tokens = 8;
  o.stop_at_eos = false;
  const std::span<const int32_t> rest(kPrompt.data() + 2, kPrompt.size() - 2);
  EXPECT_EQ(generate(t.context(), rest, o, {}, 2).tokens, expected);
}

TEST(Generator, StepsOneEngineStepAtATimeAndRefusesBadInput) {
  Session s = tiny_session(/*max_context=*/16);
  const std::vector<int32_t> expected = hand_loop(s, 3);
  GenerateOptions o;
  o.max_tokens = 3;
  o.stop_at_eos = false;
  Generator g(s.context(), kPrompt, o);
  EXPECT_FALSE(g.done());
  EXPECT_EQ(g.step().token, expected[0]);
  EXPECT_EQ(g.position(), static_cast<int>(kPrompt.size()));
  EXPECT_EQ(g.step().token, expected[1]);
  const Generation::Step last = g.step();
  EXPECT_EQ(last.token, expected[2]);
  EXPECT_TRUE(last.done && g.done());
  EXPECT_THROW(g.step(), Error);
  EXPECT_THROW(Generator(s.context(), {}, o), Error);
  EXPECT_THROW(Generator(s.context(), std::vector<int32_t>(17, 1), o), Error);
  EXPECT_THROW(Generator(s.context(), kPrompt, o, /*start_pos=*/13), Error);
  // A start past the positions the context holds would attend to stale KV.
  Context fresh(s.model());
  EXPECT_THROW(Generator(fresh, kPrompt, o, /*start_pos=*/2), Error);
  Context empty;
  EXPECT_THROW(Generator(empty, kPrompt, o), Error);
}

// ---- prompt-lookup decoding ---------------------------------------------------

// Runs a Generator to the end; returns its output tokens and its counters.
struct LookupRun {
  std::vector<int32_t> tokens, streamed;
  std::string text;
  int end_pos = 0, accepted = 0, drafted = 0;
  FinishReason finish = FinishReason::none;
};
LookupRun run_lookup(Session& s, const std::vector<int32_t>& prompt, GenerateOptions o) {
  Generator g(s.context(), prompt, o);
  LookupRun r;
  while (!g.done()) {
    const bool seen = g.next_seen();
    const Generation::Step st = g.step();
    if (seen) r.streamed.push_back(st.token);  // stop tokens too: the same in both
    // Valid positions: the prompt and every sampled token but the latest (not
    // run yet), never a rejected draft row; the Generator reads the same.
    EXPECT_EQ(s.context().position(),
              static_cast<int>(prompt.size()) + g.generation().sampled() - 1);
    EXPECT_EQ(g.position(), s.context().position());
  }
  r.tokens = g.generation().tokens();
  r.text = g.generation().text();
  r.end_pos = g.position();
  r.accepted = g.accepted();
  r.drafted = g.drafted();
  r.finish = g.generation().finish_reason();
  return r;
}

// Generates with lookup off and on: the same steps, text, positions and end.
// Returns the draft tokens lookup got accepted.
int expect_lookup_is_plain(Session& s, const std::vector<int32_t>& prompt, GenerateOptions o) {
  o.lookup = false;
  const LookupRun plain = run_lookup(s, prompt, o);
  o.lookup = true;
  const LookupRun fast = run_lookup(s, prompt, o);
  EXPECT_EQ(fast.tokens, plain.tokens);
  EXPECT_EQ(fast.streamed, plain.streamed);
  EXPECT_EQ(fast.text, plain.text);
  EXPECT_EQ(fast.end_pos, plain.end_pos);
  EXPECT_EQ(fast.finish, plain.finish);
  EXPECT_EQ(plain.drafted, 0);
  return fast.accepted;
}

// With lookup, greedy output is token for token plain decoding's, on prompts
// that repeat (drafts accepted) and that do not, under max_tokens and stops.
TEST(Lookup, GreedyOutputIsPlainDecodingsAndDraftsGetAccepted) {
  Session s = tiny_session(128);
  const std::vector<std::vector<int32_t>> prompts = {
      {24, 15, 7, 19},
      {3, 9, 14, 3, 9, 14, 3, 9, 14, 3, 9},  // input-grounded: a pattern to extend
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6},
      {20, 21, 22, 23, 25, 17, 16}};
  int accepted = 0;
  for (const auto& prompt : prompts) {
    for (int max_tokens : {1, 7, 40}) {
      GenerateOptions o;
      o.max_tokens = max_tokens;
      o.stop_at_eos = false;
      accepted += expect_lookup_is_plain(s, prompt, o);
      // A stop token inside the output ends both at the same place.
      o.lookup = false;
      const LookupRun plain = run_lookup(s, prompt, o);
      if (plain.tokens.size() > 5) {
        o.stop_tokens = {plain.tokens[5]};
        expect_lookup_is_plain(s, prompt, o);
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

// A draft's rows past the accepted ones are discarded by rewind(): the context
// goes on as if only the kept rows had run, bit for bit.
TEST(Lookup, RewindDiscardsRejectedDraftRows) {
  Session s = tiny_session(32);
  Context& c = s.context();
  const int p = static_cast<int>(kPrompt.size());
  std::vector<float> logits;
  c.prefill(kPrompt);
  c.decode_rows(std::vector<int32_t>{5, 6, 7, 8}, p, logits);  // [last, draft...]
  EXPECT_EQ(c.position(), p + 4);
  c.rewind(p + 1);  // only the first row's token was kept
  EXPECT_EQ(c.position(), p + 1);
  EXPECT_THROW(c.rewind(p + 2), Error);  // past the valid end
  EXPECT_THROW(c.rewind(-1), Error);
  const std::span<const float> got = c.decode_step(9, c.position());
  const std::vector<float> after_rows(got.begin(), got.end());
  Session t = tiny_session(32);
  t.prefill(kPrompt);
  t.decode_step(5, p);
  const std::span<const float> want = t.decode_step(9, p + 1);
  EXPECT_EQ(after_rows, std::vector<float>(want.begin(), want.end()));
  EXPECT_EQ(c.position(), t.context().position());
  Context empty;
  EXPECT_THROW(empty.rewind(0), Error);
}

TEST(Lookup, SampledGenerationNeverDrafts) {
  Session s = tiny_session(128);
  GenerateOptions o;
  o.max_tokens = 40;
  o.stop_at_eos = false;
  o.sampling.temperature = 0.8f;
  o.sampling.seed = 7;
  const LookupRun r = run_lookup(s, {3, 9, 14, 3, 9, 14, 3, 9, 14, 3, 9}, o);
  EXPECT_EQ(r.drafted, 0);
  EXPECT_EQ(r.tokens.size(), 40u);
}

}  // namespace
}  // namespace edgellm
