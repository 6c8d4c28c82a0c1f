#include "edgellm/reply_splitter.h"

namespace edgellm {

namespace {
std::variant<std::monostate, ReasoningSplitter, HarmonySplitter> splitter_for(
    const GenerateOptions::Reasoning& r) {
  if (!r.enabled) return std::monostate{};
  if (r.harmony) return HarmonySplitter(r.started);
  return ReasoningSplitter(r.started);
}
}  // namespace

ReplySplitter::ReplySplitter(const GenerateOptions::Reasoning& reasoning)
    : split_(splitter_for(reasoning)) {}

ReasoningSplitter::Piece ReplySplitter::feed(std::string_view text, bool last) {
  if (auto* s = std::get_if<ReasoningSplitter>(&split_)) return s->feed(text, last);
  if (auto* s = std::get_if<HarmonySplitter>(&split_)) return s->feed(text, last);
  return {"", std::string(text)};
}

bool ReplySplitter::holds_content(const Tools& tools) const {
  return tools.active() && !std::holds_alternative<HarmonySplitter>(split_);
}

std::optional<ToolReply> ReplySplitter::end(std::string content, const Tools& tools) const {
  if (const auto* s = std::get_if<HarmonySplitter>(&split_))
    return harmony_tool_reply(std::move(content), s->calls(), tools);
  if (!tools.active()) return std::nullopt;
  return parse_tool_output(content, tools);
}

}  // namespace edgellm
