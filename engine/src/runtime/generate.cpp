#include "edgellm/generate.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "edgellm/error.h"
#include "edgellm/harmony.h"
#include "edgellm/reasoning.h"
#include "runtime/token_mask.h"

namespace edgellm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

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

struct Generation::Constraint {
  Constraint(const Tokenizer& tokenizer, std::shared_ptr<const JsonGrammar> grammar)
      : index(TokenIndex::of(tokenizer)), matcher(std::move(grammar)), masker(index, matcher) {}
  bool allowed(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return i < index->vocab() && (bits[i / 64] >> (i % 64) & 1);
  }
  std::shared_ptr<const TokenIndex> index;
  JsonMatcher matcher;
  TokenMasker masker;
  std::vector<uint64_t> bits;  // the tokens allowed at this step
  std::vector<float> masked;   // the logits, forbidden ones at -inf
};

Generation::Generation(const Tokenizer& tokenizer, const ModelConfig& config,
                       GenerateOptions options)
    : config_(&config),
      options_(std::move(options)),
      sampler_(options_.sampling),
      stream_(tokenizer, /*skip_special_tokens=*/true,
              options_.reasoning.harmony
                  ? std::vector<std::string>(std::begin(kHarmonyMarkers), std::end(kHarmonyMarkers))
                  : std::vector<std::string>{}),
      tokenizer_(&tokenizer) {
  std::erase_if(options_.stop_strings, [](const std::string& s) { return s.empty(); });
  if (options_.max_tokens < 1)
    throw Error("max_tokens must be >= 1 (got " + std::to_string(options_.max_tokens) + ")");
  if (options_.grammar) {
    options_.lookup = false;
    constraint_ = std::make_shared<Constraint>(tokenizer, options_.grammar);
  }
  if (options_.reasoning.enabled && options_.reasoning.harmony) {
    // A harmony reply starts in its free part (a header, or the analysis body the prompt opened).
    close_marker_ = kHarmonyFinal;
    phase_ = Phase::thinking;
    in_body_ = options_.reasoning.started;
    if (options_.reasoning.budget == 0) force_close();
  } else if (options_.reasoning.enabled) {
    close_marker_ = kThinkClose;
    open_token_ = tokenizer.token_to_id(kThinkOpen);
    close_tokens_ = tokenizer.encode(kThinkClose);
    // Under a grammar a reply can only open the block with kThinkOpen's own token.
    phase_ = options_.reasoning.started       ? Phase::thinking
             : constraint_ && open_token_ < 0 ? Phase::answer
                                              : Phase::undecided;
    if (phase_ == Phase::thinking && options_.reasoning.budget == 0) force_close();
  }
}

void Generation::force_close() {
  if (options_.reasoning.harmony) {
    // Inside a body: end it and open the final one; before any text: the final header.
    if (!in_body_ && !(thought_tokens_ == 0 && thought_.empty())) return;  // in a header: later
    close_tokens_ = tokenizer_->encode(in_body_ ? kHarmonyCloseAnalysis : kHarmonyFinal);
  }
  forced_.assign(close_tokens_.begin(), close_tokens_.end());
  closing_ = true;
}

std::span<const float> Generation::constrain(std::span<const float> logits, int32_t also) {
  Constraint& c = *constraint_;
  c.masker.compute(c.bits);
  const bool complete = c.matcher.complete();
  const auto stop_id = [&](size_t id) {
    const auto t = static_cast<int32_t>(id);
    return (options_.stop_at_eos && config_->is_eos(t)) ||
           std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(), t) !=
               options_.stop_tokens.end();
  };
  c.masked.resize(logits.size());
  constexpr float kForbidden = -std::numeric_limits<float>::infinity();
  bool any = false;
  const size_t vocab = std::min(logits.size(), c.index->vocab());
  for (size_t i = 0; i < vocab; ++i) {
    const bool ok = c.bits[i / 64] >> (i % 64) & 1;
    c.masked[i] = ok ? logits[i] : kForbidden;
    any |= ok;
  }
  std::fill(c.masked.begin() + static_cast<std::ptrdiff_t>(vocab), c.masked.end(), kForbidden);
  if (complete) {
    for (const int id : config_->eos_token_ids)
      if (options_.stop_at_eos && static_cast<size_t>(id) < logits.size())
        c.masked[static_cast<size_t>(id)] = logits[static_cast<size_t>(id)], any = true;
    for (const int32_t id : options_.stop_tokens)
      if (id >= 0 && static_cast<size_t>(id) < logits.size())
        c.masked[static_cast<size_t>(id)] = logits[static_cast<size_t>(id)], any = true;
  } else {
    // A stop token the vocabulary also spells as text stays forbidden until then.
    for (size_t i = 0; i < vocab; ++i)
      if (c.masked[i] != kForbidden && stop_id(i)) c.masked[i] = kForbidden;
  }
  if (also >= 0 && static_cast<size_t>(also) < logits.size()) {
    c.masked[static_cast<size_t>(also)] = logits[static_cast<size_t>(also)];
    any = true;
  }
  if (!any) return {};
  return c.masked;
}

std::string Generation::track_reasoning(const std::string& piece) {
  thought_ += piece;
  if (phase_ == Phase::undecided) {  // decided by the text (no grammar)
    const std::string_view rest = std::string_view(thought_).substr(
        std::min(thought_.size(), thought_.find_first_not_of(" \t\r\n")));
    if (rest.starts_with(kThinkOpen)) {
      thought_ = std::string(rest.substr(kThinkOpen.size()));
      phase_ = Phase::thinking;
    } else {
      if (!kThinkOpen.starts_with(rest)) phase_ = Phase::answer;
      return {};
    }
  } else {
    ++thought_tokens_;
  }
  if (options_.reasoning.harmony) in_body_ = harmony_body_after(piece).value_or(in_body_);
  if (const size_t close = thought_.find(close_marker_); close != std::string::npos) {
    phase_ = Phase::answer;
    forced_.clear();
    // What the close's token carried past it (whitespace aside) starts the answer.
    std::string_view rest = std::string_view(thought_).substr(close + close_marker_.size());
    rest.remove_prefix(std::min(rest.size(), rest.find_first_not_of(" \t\r\n")));
    return std::string(rest);
  }
  thought_.erase(0, thought_.size() - std::min(thought_.size(), close_marker_.size() - 1));
  if (!closing_ && options_.reasoning.budget >= 0 && thought_tokens_ >= options_.reasoning.budget)
    force_close();
  return {};
}

Generation::Step Generation::next(std::span<const float> logits) {
  if (done()) throw Error("Generation::next called after the generation finished");
  if (options_.cancel && options_.cancel->load(std::memory_order_relaxed))
    return finish(FinishReason::cancelled);
  std::span<const float> sampled_logits = logits;
  const bool constrained = constraint_ && phase_ != Phase::thinking && forced_.empty();
  if (constrained) {
    sampled_logits = constrain(logits, phase_ == Phase::undecided ? open_token_ : -1);
    // Nothing allowed (a schema that cannot be completed): end rather than break it.
    if (sampled_logits.empty()) return finish(FinishReason::stop);
  }
  int32_t token = -1;
  if (!forced_.empty()) {  // the reasoning budget's close: not sampled
    token = forced_.front();
    forced_.pop_front();
  } else {
    token = sampler_.sample(sampled_logits);
  }
  if (constrained &&
      sampled_logits[static_cast<size_t>(token)] == -std::numeric_limits<float>::infinity()) {
    // The sampler's rounding fallback landed on a forbidden id: take the best allowed.
    token = static_cast<int32_t>(std::max_element(sampled_logits.begin(), sampled_logits.end()) -
                                 sampled_logits.begin());
  }
  ++sampled_;
  if (options_.on_sample) options_.on_sample(logits, token);
  const bool stop_token = (options_.stop_at_eos && config_->is_eos(token)) ||
                          std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(),
                                    token) != options_.stop_tokens.end();
  if (stop_token) {
    Step s = finish(FinishReason::stop);
    s.token = token;
    return s;
  }
  std::optional<TokenLogprobs> logprobs;
  if (options_.logprobs >= 0) {
    // Under a grammar, of the masked distribution the token was sampled from:
    // the alternatives are tokens it allowed (fewer than asked when it allows fewer).
    logprobs = TokenLogprobs{{token, token_logprob(sampled_logits, token)},
                             top_logprobs(sampled_logits, static_cast<size_t>(options_.logprobs))};
    std::erase_if(logprobs->top, [](const TokenLogprob& t) {
      return t.logprob == -std::numeric_limits<float>::infinity();
    });
  }
  tokens_.push_back(token);
  const std::string piece = stream_.push(token);
  pending_ += piece;
  bool document_ended = false;
  const auto feed_grammar = [&] {
    if (!constraint_->matcher.accept(constraint_->index->bytes(token)))
      throw Error("structured output: the grammar rejected a token its mask allowed");
  };
  if (phase_ == Phase::undecided && constraint_) {
    // Under a grammar the first token decides: kThinkOpen's opens the block,
    // any other is the grammar's.
    phase_ = token == open_token_ ? Phase::thinking : Phase::answer;
    if (phase_ == Phase::answer) feed_grammar();
    if (phase_ == Phase::thinking && options_.reasoning.budget == 0) force_close();
  } else if (phase_ != Phase::answer) {
    const std::string answer_start = track_reasoning(piece);
    // A close token that carried text past the block: the grammar must take it,
    // or the answer cannot be the grammar's and it ends here.
    if (constraint_ && !answer_start.empty() && !constraint_->matcher.accept(answer_start)) {
      pending_ += stream_.flush();
      finish_ = FinishReason::stop;
    }
  } else if (constraint_) {
    feed_grammar();
  }
  if (constraint_) document_ended = constraint_->matcher.ended();
  // The earliest stop string in the held-back text ends the generation there.
  size_t cut = std::string::npos;
  for (const std::string& stop : options_.stop_strings)
    if (const size_t at = pending_.find(stop); at < cut) {
      cut = at;
      stop_string_ = stop;
    }
  if (cut != std::string::npos) {
    pending_.resize(cut);
    finish_ = FinishReason::stop;
  } else if (document_ended) {
    pending_ += stream_.flush();
    finish_ = FinishReason::stop;
  } else if (static_cast<int>(tokens_.size()) >= options_.max_tokens) {
    pending_ += stream_.flush();
    finish_ = FinishReason::length;
  }
  Step s = emit(token, /*flush=*/done());
  s.logprobs = std::move(logprobs);
  return s;
}

Generation::Step Generation::finish(FinishReason reason) {
  if (!done()) {
    pending_ += stream_.flush();
    finish_ = reason;
  }
  return emit(-1, /*flush=*/true);
}

int32_t Generation::next_unseen(std::span<const float> logits) {
  if (finish_ != FinishReason::stop || !options_.decode_past_stop)
    throw Error("Generation::next_unseen called without a stop to decode past");
  const int32_t token = sampler_.sample(logits);
  ++sampled_;
  if (options_.on_sample) options_.on_sample(logits, token);
  return token;
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

Generator::Generator(Context& context, std::vector<int32_t> prompt, GenerateOptions options,
                     int start_pos)
    : context_(&context),
      prompt_(std::move(prompt)),
      gen_(context.tokenizer(), context.config(), std::move(options)) {
  check(!prompt_.empty(), "generate needs at least one prompt token");
  check(start_pos >= 0 && start_pos + prompt_.size() <= static_cast<size_t>(context.max_context()),
        "a prompt of " + std::to_string(prompt_.size()) + " tokens at position " +
            std::to_string(start_pos) + " does not fit the context of " +
            std::to_string(context.max_context()) + " positions");
  check(start_pos <= context.position(),
        "a prompt at position " + std::to_string(start_pos) + " continues past the " +
            std::to_string(context.position()) + " positions in the context's cache");
  context.rewind(start_pos);  // the prefill runs at the context's position
}

bool Generator::done() const {
  if (!started_ || !queued_.empty()) return false;
  if (!gen_.done()) return false;
  const GenerateOptions& o = gen_.options();
  const bool cancelled = o.cancel && o.cancel->load(std::memory_order_relaxed);
  // Unseen decoding goes on after a stop (not after length or a cancel) while
  // tokens and positions are left.
  return !(o.decode_past_stop && gen_.finish_reason() == FinishReason::stop && !cancelled &&
           gen_.sampled() < o.max_tokens && position() < context_->max_context());
}

Generation::Step Generator::step() {
  if (done()) throw Error("Generator::step called after the generation finished");
  if (!started_) {
    started_ = true;
    Generation::Step s = gen_.next(context_->prefill(prompt_, position(), gen_.options().capture));
    last_ = s.token;
    return s;
  }
  if (!queued_.empty()) {
    Generation::Step s = std::move(queued_.front());
    queued_.pop_front();
    return s;
  }
  if (gen_.done()) {  // past a stop: decode on, unseen
    const std::span<const float> logits = context_->decode_step(last_, position());
    ++decode_steps_;
    Generation::Step s;
    s.token = last_ = gen_.next_unseen(logits);
    s.done = true;
    return s;
  }
  if (position() >= context_->max_context()) return gen_.finish(FinishReason::length);
  // A draft never runs past the context nor past the tokens max_tokens leaves.
  const int room = std::min(context_->max_context() - position() - 1,
                            gen_.options().max_tokens - static_cast<int>(gen_.tokens().size()) - 1);
  const std::vector<int32_t> draft = PromptLookup::eligible(gen_.options())
                                         ? lookup_.draft(prompt_, gen_.tokens(), room)
                                         : std::vector<int32_t>{};
  if (!draft.empty()) {
    std::vector<Generation::Step> steps = lookup_.verify(*context_, gen_, last_, draft);
    decode_steps_ += static_cast<int>(steps.size());  // tokens decoded, as plain decoding counts
    last_ = steps.back().token;
    for (size_t i = 1; i < steps.size(); ++i) queued_.push_back(std::move(steps[i]));
    return std::move(steps.front());
  }
  const auto start = std::chrono::steady_clock::now();
  const std::span<const float> logits = context_->decode_step(last_, position());
  lookup_.plain_step(ms_since(start));
  ++decode_steps_;
  Generation::Step s = gen_.next(logits);
  last_ = s.token;
  return s;
}

GenerateResult generate(Context& context, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TokenCallback& on_token,
                        int start_pos) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  // Setup (copies, checks) before the clock.
  Generator gen(context, {prompt.begin(), prompt.end()}, options, start_pos);
  GenerateResult r;
  r.prompt_tokens = prompt.size();
  // The output's steps go to the callback; a false return ends the generation.
  auto deliver = [&](const Generation::Step& s) {
    if (on_token && !on_token(s.token, s.text)) {
      gen.drop_queued();
      if (!gen.generation().done()) gen.cancel();
    }
  };

  const auto prefill_start = Clock::now();
  const Generation::Step first = gen.step();
  r.ttft_ms = ms_since(prefill_start);
  deliver(first);
  const auto decode_start = Clock::now();
  while (!gen.done()) {
    const bool seen = gen.next_seen();
    const Generation::Step s = gen.step();
    if (seen) deliver(s);
  }
  r.decode_ms = ms_since(decode_start);

  const Generation& g = gen.generation();
  r.tokens = g.tokens();
  r.text = g.text();
  r.finish = g.finish_reason();
  r.decode_steps = gen.decode_steps();
  r.end_pos = context.position();
  return r;
}

}  // namespace edgellm
