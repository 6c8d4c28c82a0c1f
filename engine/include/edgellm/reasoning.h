// Reasoning models (Qwen3, DeepSeek R1 and its distills, QwQ) write their
// thinking between <think> and </think>, then the answer. For a template that
// lays such blocks out (ChatTemplate::thinks), a reply is two parts: the
// reasoning (reasoning_content on the OpenAI routes, a thinking block on
// Anthropic's) and the content after it. The prompt may already have opened the
// block (R1's generation prompt ends with "<think>\n"); else the reply opens it
// with its first text, or never does (thinking off, or a model that skips it).
//
// Generation (edgellm/generate.h) binds a structured-output grammar only after
// the block and can close it after a budget of tokens; ReasoningSplitter turns
// the streamed text into the two parts, for every front end alike.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "edgellm/generate.h"
#include "edgellm/tokenizer.h"

namespace edgellm {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

// The prompt's last block marker is an opening one: the reply starts inside the block.
bool reasoning_started(std::string_view prompt_text);

// A chat reply's reasoning rules: on for a template that thinks or writes
// harmony, except for a forced tool call (it answers at once); started when
// the prompt's end opened the block (harmony: an analysis body); `budget` as
// GenerateOptions::Reasoning's.
GenerateOptions::Reasoning chat_reasoning(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                          std::span<const int32_t> prompt, bool forced_call,
                                          int budget);

// A reply's text, fed as it streams, split into reasoning and content. Text
// that may still turn out to be a marker is held until the next piece, or
// released with the `last` one. Whitespace between the opening marker and the reasoning, and
// between the closing one and the content, is dropped (the template writes it).
// A reply that never opens a block is all content; one cut off inside its
// block is all reasoning.
class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool started);

  struct Piece {
    std::string reasoning, content;
  };
  Piece feed(std::string_view text, bool last = false);  // last: the reply ended

 private:
  enum class Phase { undecided, leading, reasoning, content };
  void run(Piece& out, bool last);

  Phase phase_;
  std::string held_;
  bool content_began_ = false;  // whitespace before the content was dropped
};

// A whole reply's two parts (feeding it as one last piece).
ReasoningSplitter::Piece split_reasoning(std::string_view reply, bool started);

}  // namespace edgellm
