#include "edgellm/harmony.h"

#include <algorithm>
#include <optional>
#include <span>

namespace edgellm {

namespace {
constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kConstrain = "<|constrain|>", kTo = "to=", kFunctions = "functions.";
// What ends a body: the turn goes on (<|end|>), or the reply ends.
constexpr std::string_view kBodyEnds[] = {"<|end|>", "<|return|>", "<|call|>"};
// How a header starts: a later message's <|start|>, or (the prompt having
// written "<|start|>assistant") the first one's channel or recipient.
constexpr std::string_view kHeaderStarts[] = {kStart, kChannel, " to="};

// The longest tail of `text` that is a proper prefix of one of `markers`: it
// may be the start of that marker, completed by the next piece.
size_t partial_marker(std::string_view text, std::span<const std::string_view> markers) {
  size_t longest = 0;
  for (std::string_view m : markers)
    for (size_t len = std::min(m.size() - 1, text.size()); len > longest; --len)
      if (text.ends_with(m.substr(0, len))) {
        longest = len;
        break;
      }
  return longest;
}

// A channel, recipient or constraint name: "analysis", "functions.get_weather", "json".
bool is_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  });
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t end = std::min(s.find(' ', i), s.size());
    if (end > i) out.push_back(s.substr(i, end - i));
    i = end + 1;
  }
  return out;
}
}  // namespace

bool harmony_analysis_open(std::string_view prompt_text) {
  constexpr std::string_view kAnalysisOpen = "<|start|>assistant<|channel|>analysis<|message|>";
  const size_t start = prompt_text.rfind(kStart);
  if (start == std::string_view::npos) return false;
  const std::string_view tail = prompt_text.substr(start);
  return tail.starts_with(kAnalysisOpen) &&
         std::none_of(std::begin(kBodyEnds), std::end(kBodyEnds),
                      [&](std::string_view e) { return tail.find(e) != std::string_view::npos; });
}

std::optional<bool> harmony_body_after(std::string_view text) {
  std::optional<bool> in_body;
  size_t last = 0;
  const auto mark = [&](std::string_view marker, bool opens) {
    const size_t at = text.rfind(marker);
    if (at != std::string_view::npos && (!in_body || at >= last)) {
      last = at;
      in_body = opens;
    }
  };
  mark(kMessage, true);
  for (std::string_view m : kBodyEnds) mark(m, false);
  for (std::string_view m : {kStart, kChannel, kConstrain}) mark(m, false);
  return in_body;
}

ReasoningSplitter::Piece HarmonySplitter::feed(std::string_view text, bool last) {
  held_ += text;
  ReasoningSplitter::Piece out;
  run(out, last);
  return out;
}

// "[<|start|>assistant] [to=R] <|channel|>CHANNEL [to=R] [<|constrain|>NAME | NAME]..."
bool HarmonySplitter::read_header(std::string_view h) {
  if (h.starts_with(kStart)) {
    h.remove_prefix(kStart.size());
    if (!h.starts_with("assistant")) return false;
    h.remove_prefix(std::string_view("assistant").size());
  }
  const size_t channel_at = h.find(kChannel);
  if (channel_at == std::string_view::npos) return false;
  std::string_view recipient;
  const auto take_recipient = [&](std::string_view w) {
    if (!w.starts_with(kTo) || !recipient.empty()) return false;
    recipient = w.substr(kTo.size());
    return is_name(recipient);
  };
  for (std::string_view w : words(h.substr(0, channel_at)))
    if (!take_recipient(w)) return false;
  // The constraint is its own word, with or without a space before it.
  std::string options;
  std::string_view tail = h.substr(channel_at + kChannel.size());
  for (size_t at; (at = tail.find(kConstrain)) != std::string_view::npos;) {
    options.append(tail.substr(0, at)).append(" ").append(kConstrain);
    tail.remove_prefix(at + kConstrain.size());
  }
  options.append(tail);
  const std::vector<std::string_view> rest = words(options);
  if (rest.empty() || !is_name(rest[0])) return false;
  for (size_t i = 1; i < rest.size(); ++i) {
    std::string_view w = rest[i];
    if (w.starts_with(kTo)) {
      if (!take_recipient(w)) return false;
      continue;
    }
    if (w.starts_with(kConstrain)) w.remove_prefix(kConstrain.size());
    if (!is_name(w)) return false;
  }
  if (!recipient.empty()) {
    sink_ = Sink::call;
    calls_.push_back({std::string(recipient), ""});
  } else {
    sink_ = rest[0] == "analysis" ? Sink::reasoning : Sink::content;
  }
  return true;
}

void HarmonySplitter::run(ReasoningSplitter::Piece& out, bool last) {
  for (;;) {
    switch (phase_) {
      case Phase::header: {
        if (held_.empty()) return;
        bool starts = false, may_start = false;
        for (std::string_view s : kHeaderStarts) {
          starts = starts || held_.starts_with(s);
          may_start = may_start || s.starts_with(held_);
        }
        if (!starts) {
          if (may_start && !last) return;
          phase_ = Phase::plain;
          break;
        }
        const size_t message = held_.find(kMessage);
        if (message == std::string::npos && !last &&
            held_.size() < kMaxHarmonyHeader + kMessage.size())
          return;  // the header may still be coming
        if (message == std::string::npos || message > kMaxHarmonyHeader ||
            !read_header(std::string_view(held_).substr(0, message))) {
          phase_ = Phase::plain;  // not provably a header: as written
          break;
        }
        held_.erase(0, message + kMessage.size());
        phase_ = Phase::body;
        break;
      }
      case Phase::body: {
        size_t end = std::string::npos, end_size = 0;
        for (std::string_view e : kBodyEnds)
          if (const size_t at = held_.find(e); at < end) {
            end = at;
            end_size = e.size();
          }
        const size_t n = end != std::string::npos ? end
                         : last                   ? held_.size()
                                                  : held_.size() - partial_marker(held_, kBodyEnds);
        std::string& sink = sink_ == Sink::reasoning ? out.reasoning
                            : sink_ == Sink::call    ? calls_.back().arguments
                                                     : out.content;
        sink.append(held_, 0, n);
        held_.erase(0, end != std::string::npos ? end + end_size : n);
        if (end == std::string::npos) return;
        phase_ = Phase::header;
        break;
      }
      case Phase::plain:
        out.content += held_;
        held_.clear();
        return;
    }
  }
}

ToolReply harmony_tool_reply(std::string content, const std::vector<HarmonyCall>& calls,
                             const Tools& tools) {
  ToolReply reply{std::move(content), {}};
  for (const HarmonyCall& c : calls) {
    std::optional<ToolCall> call;
    if (c.recipient.starts_with(kFunctions))
      call = read_tool_call(std::string_view(c.recipient).substr(kFunctions.size()), c.arguments,
                            tools);
    if (!call)
      reply.content += c.arguments;
    else if (tools.parallel || reply.calls.empty())
      reply.calls.push_back(std::move(*call));
  }
  return reply;
}

HarmonyReply parse_harmony_reply(std::string_view text, const Tools& tools) {
  HarmonySplitter splitter;
  ReasoningSplitter::Piece parts = splitter.feed(text, /*last=*/true);
  return {std::move(parts.reasoning),
          harmony_tool_reply(std::move(parts.content), splitter.calls(), tools)};
}

}  // namespace edgellm
