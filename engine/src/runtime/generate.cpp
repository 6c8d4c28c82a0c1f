#include "edgellm/generate.h"

#include <algorithm>
#include <chrono>

#include "edgellm/error.h"

namespace edgellm {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::none:
      break;
  }
  return "none";
}

Generation::Generation(const Tokenizer& tokenizer, const ModelConfig& config,
                       GenerateOptions options)
    : config_(&config),
      options_(std::move(options)),
      sampler_(options_.sampling),
      stream_(tokenizer) {
  std::erase_if(options_.stop_strings, [](const std::string& s) { return s.empty(); });
  if (options_.max_tokens < 1)
    throw Error("max_tokens must be >= 1 (got " + std::to_string(options_.max_tokens) + ")");
}

Generation::Step Generation::next(std::span<const float> logits) {
  if (done()) throw Error("Generation::next called after the generation finished");
  if (options_.cancel && options_.cancel->load(std::memory_order_relaxed))
    return finish(FinishReason::cancelled);
  const int32_t token = sampler_.sample(logits);
  const bool stop_token = (options_.stop_at_eos && config_->is_eos(token)) ||
                          std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(),
                                    token) != options_.stop_tokens.end();
  if (stop_token) {
    Step s = finish(FinishReason::stop);
    s.token = token;
    return s;
  }
  tokens_.push_back(token);
  pending_ += stream_.push(token);
  // The earliest stop string in the held-back text ends the generation there.
  size_t cut = std::string::npos;
  for (const std::string& stop : options_.stop_strings) cut = std::min(cut, pending_.find(stop));
  if (cut != std::string::npos) {
    pending_.resize(cut);
    finish_ = FinishReason::stop;
    return emit(token, /*flush=*/true);
  }
  if (static_cast<int>(tokens_.size()) >= options_.max_tokens) {
    pending_ += stream_.flush();
    finish_ = FinishReason::length;
    return emit(token, /*flush=*/true);
  }
  return emit(token, /*flush=*/false);
}

Generation::Step Generation::finish(FinishReason reason) {
  if (!done()) {
    pending_ += stream_.flush();
    finish_ = reason;
  }
  return emit(-1, /*flush=*/true);
}

// Returns pending_ except, unless flushing, its longest suffix that is a
// proper prefix of a stop string (the next tokens may complete it).
Generation::Step Generation::emit(int32_t token, bool flush) {
  size_t hold = 0;
  if (!flush) {
    for (const std::string& stop : options_.stop_strings)
      for (size_t len = std::min(stop.size() - 1, pending_.size()); len > hold; --len)
        if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
          hold = len;
          break;
        }
  }
  Step s;
  s.token = token;
  s.text = pending_.substr(0, pending_.size() - hold);
  s.done = done();
  pending_.erase(0, pending_.size() - hold);
  text_ += s.text;
  return s;
}

GenerateResult generate(Context& context, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token,
                        int start_pos) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  Generation gen(context.tokenizer(), context.config(), options);
  GenerateResult r;
  r.prompt_tokens = prompt.size();
  int pos = start_pos + static_cast<int>(prompt.size());
  auto deliver = [&](const Generation::Step& s) {
    if (on_token && !on_token(s.token, s.text) && !gen.done()) gen.finish(FinishReason::cancelled);
  };

  const auto prefill_start = Clock::now();
  Generation::Step step = gen.next(context.prefill(prompt, start_pos));
  r.ttft_ms = ms_since(prefill_start);
  deliver(step);
  const auto decode_start = Clock::now();
  while (!gen.done()) {
    if (pos >= context.max_context()) {
      deliver(gen.finish(FinishReason::length));
      break;
    }
    step = gen.next(context.decode_step(step.token, pos++));
    ++r.decode_steps;
    deliver(step);
  }
  r.decode_ms = ms_since(decode_start);

  r.tokens = gen.tokens();
  r.text = gen.text();
  r.finish = gen.finish_reason();
  return r;
}

}  // namespace edgellm
