// A chat reply's text read the one way its template writes it, for every front
// end (edgellm serve's OpenAI and Anthropic routes, LLM.chat, the Ray replicas):
// chosen once from the request's reasoning rules (chat_reasoning), it is
// ReasoningSplitter for <think> blocks, HarmonySplitter for harmony (gpt-oss),
// or nothing (the text is content). Calls are read at the reply's end: from the
// content (parse_tool_output, so content is held while tools are active), or
// from harmony's messages addressed to "functions.NAME" (harmony_tool_reply:
// content streams as it comes and only the calls wait).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "edgellm/generate.h"
#include "edgellm/harmony.h"
#include "edgellm/reasoning.h"
#include "edgellm/tool_calls.h"

namespace edgellm {

class ReplySplitter {
 public:
  // `reasoning`: the request's GenerateOptions::Reasoning (off: the text is content).
  explicit ReplySplitter(const GenerateOptions::Reasoning& reasoning);

  // `text` as it streams, split into reasoning and content; `last`: the reply ended.
  ReasoningSplitter::Piece feed(std::string_view text, bool last = false);

  // The content must be held until the reply ends (its calls are parsed from it).
  bool holds_content(const Tools& tools) const;

  // After the last feed: the reply's calls and the content they leave, where
  // `content` is what was held (or the whole content, not streamed); nullopt
  // when nothing is read at the end (no active tools, and no calls of its own).
  std::optional<ToolReply> end(std::string content, const Tools& tools) const;

 private:
  std::variant<std::monostate, ReasoningSplitter, HarmonySplitter> split_;
};

}  // namespace edgellm
