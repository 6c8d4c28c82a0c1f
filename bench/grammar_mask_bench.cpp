// What structured output costs per token (not a test): a constrained greedy
// generation on a real model per schema, then its tokens replayed through two
// Generations, one with the grammar and one without, on the same logits; the
// difference of their next() times is the mask (trie walk, masking the
// logits, advancing the matcher). Compared with the model's decode step.
//
//   grammar_mask_bench --model DIR [--threads 2] [--tokens 96] [--reps 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "edgellm/json_grammar.h"
#include "edgellm/session.h"

using namespace edgellm;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Case {
  const char* name;
  const char* prompt;
  const char* schema;  // nullptr: any JSON object
};

const Case kCases[] = {
    {"json_object", "Describe a cat as a JSON object with a name, an age and three hobbies.",
     nullptr},
    {"person", "Give me a fictional person as JSON.",
     R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}, "email": {"type": "string"},
        "role": {"enum": ["admin", "user", "guest"]},
        "skills": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
        "address": {"type": "object", "properties": {"street": {"type": "string"},
          "city": {"type": "string"}, "zip": {"type": "string", "maxLength": 10}},
          "required": ["street", "city"]}},
        "required": ["name", "age", "role", "skills", "address"]})"},
    {"story", "Write a short story about a robot, as JSON with a title and a body.",
     R"({"type": "object", "properties": {"title": {"type": "string"},
        "body": {"type": "string"}}, "required": ["title", "body"]})"},
};

}  // namespace

int main(int argc, char** argv) try {
  std::string model_dir;
  int threads = 2, tokens = 96, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model")
      model_dir = argv[i + 1];
    else if (k == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (k == "--tokens")
      tokens = std::atoi(argv[i + 1]);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else
      throw Error("unknown option " + k);
  }
  check(!model_dir.empty(), "--model DIR is required");
  Model model;
  SessionOptions so;
  so.threads = threads;
  so.max_context = 512;
  model.setup(model_dir, so);
  const Tokenizer& tok = model.tokenizer();
  {
    // Once per tokenizer: the vocabulary's byte trie (then cached).
    const auto t0 = Clock::now();
    GenerateOptions o;
    o.grammar = any_json_object();
    Generation first(tok, model.config(), o);
    std::printf(
        "token index (first constrained generation of this tokenizer): %.1f ms, "
        "vocab %zu\n",
        ms_since(t0), tok.vocab_size());
  }
  std::printf("%-12s %6s %10s %10s %10s %10s %8s\n", "schema", "tokens", "decode_ms", "mask_ms",
              "mask_p90", "mask_max", "ratio");
  for (const Case& c : kCases) {
    const auto grammar = c.schema ? compile_json_schema(c.schema) : any_json_object();
    const std::vector<ChatMessage> messages = {{"user", c.prompt}};
    const std::vector<int32_t> prompt =
        model.chat_template().available()
            ? tok.encode(model.chat_template().render(messages, true), false)
            : tok.encode(std::string(c.prompt) + "\n", true);  // a base model: the raw text
    // The model's own constrained output (and its decode steps' time).
    Context ctx(model);
    GenerateOptions o;
    o.max_tokens = tokens;
    o.grammar = grammar;
    const GenerateResult r = generate(ctx, prompt, o);
    const double decode_ms = r.decode_ms / std::max(1, r.decode_steps);
    // Replay: the same tokens through Generations with and without the grammar.
    const size_t vocab = static_cast<size_t>(model.config().vocab_size);
    std::vector<std::vector<float>> logits(r.tokens.size(), std::vector<float>(vocab, 0.0f));
    for (size_t i = 0; i < r.tokens.size(); ++i) logits[i][static_cast<size_t>(r.tokens[i])] = 10;
    std::vector<double> extra(r.tokens.size(), 1e9);
    for (int rep = 0; rep < reps; ++rep) {
      GenerateOptions plain_o = o;
      plain_o.grammar = nullptr;
      Generation with(tok, model.config(), o), without(tok, model.config(), plain_o);
      for (size_t i = 0; i < r.tokens.size() && !with.done() && !without.done(); ++i) {
        auto t0 = Clock::now();
        with.next(logits[i]);
        const double a = ms_since(t0);
        t0 = Clock::now();
        without.next(logits[i]);
        extra[i] = std::min(extra[i], a - ms_since(t0));  // best of reps: the noise is additive
      }
    }
    std::vector<double> sorted = extra;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0;
    for (const double x : extra) mean += x;
    mean /= static_cast<double>(std::max<size_t>(1, extra.size()));
    const double p90 = sorted.empty() ? 0 : sorted[sorted.size() * 9 / 10];
    const double max = sorted.empty() ? 0 : sorted.back();
    std::printf("%-12s %6zu %10.3f %10.3f %10.3f %10.3f %7.1f%%\n", c.name, r.tokens.size(),
                decode_ms, mean, p90, max, 100.0 * mean / decode_ms);
    const size_t worst =
        static_cast<size_t>(std::max_element(extra.begin(), extra.end()) - extra.begin());
    std::printf("  slowest step %zu, after: %s\n", worst,
                tok.decode(std::span(r.tokens).first(worst)).c_str());
    std::printf("  %s\n", r.text.substr(0, 160).c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "grammar_mask_bench: %s\n", e.what());
  return 1;
}
