#include "edgellm/reasoning.h"

#include <algorithm>

#include "edgellm/harmony.h"

namespace edgellm {

namespace {
size_t first_non_space(std::string_view s) {
  const size_t i = s.find_first_not_of(" \t\r\n");
  return i == std::string_view::npos ? s.size() : i;
}

// The longest proper prefix of `marker` that `text` ends with: it may be the
// start of the marker, completed by the next piece.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len)
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  return 0;
}
}  // namespace

bool reasoning_started(std::string_view prompt_text) {
  const size_t open = prompt_text.rfind(kThinkOpen);
  const size_t close = prompt_text.rfind(kThinkClose);
  return open != std::string_view::npos && (close == std::string_view::npos || open > close);
}

GenerateOptions::Reasoning chat_reasoning(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                          std::span<const int32_t> prompt, bool forced_call,
                                          int budget) {
  if (!(chat.thinks() || chat.harmony()) || forced_call) return {};
  // Special tokens kept: harmony's markers are special tokens. 64 tokens hold
  // the last header even where "assistant" or "analysis" take several.
  const std::string tail = tokenizer.decode(prompt.last(std::min<size_t>(prompt.size(), 64)));
  if (chat.harmony())
    return {
        .enabled = true, .started = harmony_analysis_open(tail), .budget = budget, .harmony = true};
  return {.enabled = true, .started = reasoning_started(tail), .budget = budget};
}

ReasoningSplitter::ReasoningSplitter(bool started)
    : phase_(started ? Phase::leading : Phase::undecided) {}

ReasoningSplitter::Piece ReasoningSplitter::feed(std::string_view text, bool last) {
  held_ += text;
  Piece out;
  run(out, last);
  return out;
}

ReasoningSplitter::Piece split_reasoning(std::string_view reply, bool started) {
  return ReasoningSplitter(started).feed(reply, /*last=*/true);
}

void ReasoningSplitter::run(Piece& out, bool last) {
  for (;;) {
    switch (phase_) {
      case Phase::undecided: {
        const std::string_view rest = std::string_view(held_).substr(first_non_space(held_));
        if (rest.starts_with(kThinkOpen)) {
          held_ = std::string(rest.substr(kThinkOpen.size()));
          phase_ = Phase::leading;
        } else if (!last && kThinkOpen.starts_with(rest)) {
          return;  // whitespace, or the start of the opening marker: not decided yet
        } else {
          phase_ = Phase::content;
        }
        break;
      }
      case Phase::leading:
        held_.erase(0, first_non_space(held_));
        if (held_.empty()) return;
        phase_ = Phase::reasoning;
        break;
      case Phase::reasoning: {
        const size_t close = held_.find(kThinkClose);
        if (close != std::string::npos) {
          out.reasoning += held_.substr(0, close);
          held_.erase(0, close + kThinkClose.size());
          phase_ = Phase::content;
          break;
        }
        const size_t keep = last ? 0 : partial_marker(held_, kThinkClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return;
      }
      case Phase::content:
        if (!content_began_) {
          held_.erase(0, first_non_space(held_));
          if (held_.empty()) return;
          content_began_ = true;
        }
        out.content += held_;
        held_.clear();
        return;
    }
  }
}

}  // namespace edgellm
