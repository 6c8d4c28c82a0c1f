#include "edgellm/generate.h"

#include <algorithm>
#include <chrono>

namespace edgellm {

namespace {
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

bool PromptLookup::eligible(const GenerateOptions& options) {
  // A constrained generation (grammar) decodes step by step: kept simple, though
  // Generation::next would mask each verified row as it masks a step.
  return options.lookup && !options.grammar && options.sampling.temperature == 0.0f;
}

std::vector<int32_t> PromptLookup::draft(std::span<const int32_t> prompt,
                                         std::span<const int32_t> output, int limit) const {
  limit = std::min(limit, draft_len_);
  if (pause_ > 0 || limit < 1) return {};
  std::vector<int32_t> h(prompt.begin(), prompt.end());
  h.insert(h.end(), output.begin(), output.end());
  const int end = static_cast<int>(h.size());
  for (int n = std::min(3, end - 1); n >= 1; --n) {
    // The latest earlier occurrence of h's last n tokens that has a follower.
    for (int start = end - n - 1; start >= 0; --start) {
      if (!std::equal(h.begin() + start, h.begin() + start + n, h.end() - n)) continue;
      const int from = start + n;
      const int take = std::min(limit, end - from);
      return {h.begin() + from, h.begin() + from + take};
    }
  }
  return {};
}

std::vector<Generation::Step> PromptLookup::verify(Context& context, Generation& gen, int32_t last,
                                                   std::span<const int32_t> draft) {
  const int pos = context.position();
  std::vector<int32_t> rows{last};
  rows.insert(rows.end(), draft.begin(), draft.end());
  const auto start = std::chrono::steady_clock::now();
  context.decode_rows(rows, pos, logits_);
  const double verify_ms = ms_since(start);
  const size_t vocab = logits_.size() / rows.size();
  std::vector<Generation::Step> steps;
  int kept = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    // Row i holds the logits after rows[i]; its KV (position pos + i) is the
    // one plain decoding would have, whatever follows.
    steps.push_back(gen.next({logits_.data() + i * vocab, vocab}));
    const Generation::Step& s = steps.back();
    if (s.done || i == draft.size() || s.token != draft[i]) break;
    ++kept;
  }
  // Rows past the returned steps hold draft tokens plain decoding never ran:
  // drop them (the next forward overwrites their KV).
  context.rewind(pos + static_cast<int>(steps.size()));
  drafted_ += static_cast<int>(draft.size());
  accepted_ += kept;
  // Adapt: grow on full acceptance, shrink to what was kept otherwise.
  draft_len_ = kept == static_cast<int>(draft.size()) ? std::min(draft_len_ * 2, kMaxDraft)
                                                      : std::max(1, kept);
  // A draft that cost more than plain steps for its tokens (little kept, or
  // batched rows no faster than one by one) counts as a miss; after three in a
  // row (open-ended text) rest, twice as long as the last rest when no draft
  // paid in between (a kernel on which rows never pay).
  const bool paid = kept > 0 && (step_ms_ <= 0 || verify_ms < step_ms_ * (kept + 1));
  if (paid) {
    misses_ = 0;
    rest_ = kMinRest;
  } else if (++misses_ >= 3) {
    misses_ = 0;
    pause_ = rest_;
    rest_ = std::min(rest_ * 2, kMaxRest);
  }
  return steps;
}

void PromptLookup::plain_step(double ms) {
  if (pause_ > 0) --pause_;
  step_ms_ = step_ms_ <= 0 ? ms : 0.8 * step_ms_ + 0.2 * ms;
}

}  // namespace edgellm
