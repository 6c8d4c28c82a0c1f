// gpt-oss replies in OpenAI's harmony format (ChatTemplate::harmony): a run of
// messages, each a header then a body,
//   <|channel|>analysis<|message|>THINKING<|end|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME
//   <|constrain|>json<|message|>ARGS<|call|>
// (the recipient "to=..." may also follow the role: "<|start|>assistant to=functions.NAME
// <|channel|>commentary json<|message|>"). The generation prompt ends with
// "<|start|>assistant", so the first header has no <|start|> of its own;
// <|return|> and <|call|> are stop tokens, so the last body usually ends the text.
//
// HarmonySplitter reads the streamed text as ReasoningSplitter reads <think>
// blocks: analysis bodies are the reasoning, final (and commentary without a
// recipient: preambles to the user) the content, and a body addressed to a
// recipient is a call, kept until the reply ends. Markers reach neither part.
// It fails closed: text that does not parse as a header (a reply that is not
// harmony, a header past kMaxHarmonyHeader bytes or cut off) is content as
// written, and so is everything after it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edgellm/reasoning.h"
#include "edgellm/tool_calls.h"

namespace edgellm {

// A header longer than this (role, channel, recipient, constraint) is not one.
inline constexpr size_t kMaxHarmonyHeader = 256;

// The markers a harmony reply is read by: special tokens that its text keeps
// (generation drops the others, as for any template).
inline constexpr std::string_view kHarmonyMarkers[] = {
    "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
    "<|end|>",   "<|return|>",  "<|call|>"};

// The final channel's header: the answer (and a structured output's document) follows it.
inline constexpr std::string_view kHarmonyFinal = "<|channel|>final<|message|>";
// What closes a reasoning (analysis) body and opens the final one: a reasoning
// budget's close.
inline constexpr std::string_view kHarmonyCloseAnalysis =
    "<|end|><|start|>assistant<|channel|>final<|message|>";

// The prompt's end opened an analysis body ("<|start|>assistant<|channel|>analysis<|message|>"
// with no end after it): the reply starts inside its reasoning.
bool harmony_analysis_open(std::string_view prompt_text);

// Whether `text`'s last marker opens a body (<|message|>: true) or ends one or
// starts a header (false); nullopt when it holds no marker.
std::optional<bool> harmony_body_after(std::string_view text);

// A message addressed to a recipient ("functions.get_weather") and its body.
struct HarmonyCall {
  std::string recipient, arguments;
};

class HarmonySplitter {
 public:
  // `in_analysis`: the prompt opened an analysis body (harmony_analysis_open).
  explicit HarmonySplitter(bool in_analysis = false)
      : phase_(in_analysis ? Phase::body : Phase::header),
        sink_(in_analysis ? Sink::reasoning : Sink::content) {}
  // `text` as it streams; `last`: the reply ended (held text is released).
  ReasoningSplitter::Piece feed(std::string_view text, bool last = false);
  // The messages addressed to a recipient so far (complete once `last` was fed).
  const std::vector<HarmonyCall>& calls() const { return calls_; }

 private:
  enum class Phase { header, body, plain };
  enum class Sink { reasoning, content, call };
  void run(ReasoningSplitter::Piece& out, bool last);
  bool read_header(std::string_view header);  // false: not a header

  Phase phase_;
  Sink sink_;
  std::string held_;
  std::vector<HarmonyCall> calls_;
};

// A finished reply's calls read against `tools`: a call to "functions.NAME"
// with NAME among the active tools and a JSON-object body becomes a ToolCall;
// any other call's body is content (appended to `content`), as
// parse_tool_output leaves what is not a call.
ToolReply harmony_tool_reply(std::string content, const std::vector<HarmonyCall>& calls,
                             const Tools& tools);

// A whole reply: its reasoning, and its content and calls.
struct HarmonyReply {
  std::string reasoning;
  ToolReply reply;
};
HarmonyReply parse_harmony_reply(std::string_view text, const Tools& tools);

}  // namespace edgellm
