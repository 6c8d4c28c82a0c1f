// The Messages API's reply on `edgellm serve`: a submitted request's stream
// written through httplib as one message or as Anthropic's events, with the
// shapes of anthropic_messages.h (which the Ray ingress writes too).
#include <chrono>

#include <httplib.h>

#include "anthropic_messages.h"
#include "edgellm/reply_splitter.h"
#include "request_wait.h"

namespace edgellm::anthropic {

namespace {

constexpr const char* kShutdownMessage =
    "the server shut down before the request finished; retry it";

Outcome outcome(const RequestStream& s) {
  return {s.finish, s.stop_string, s.prompt_tokens, s.cached_tokens, s.completion_tokens};
}

// A request the engine failed or the shutdown cancelled: its status and message.
bool failed(const RequestStream& s, int& status, std::string& message) {
  if (s.error.empty() && s.finish != FinishReason::cancelled) return false;
  status = s.error.empty() ? 503 : 500;
  message = s.error.empty() ? kShutdownMessage : s.error;
  return true;
}

}  // namespace

void write_reply(httplib::Response& res, std::shared_ptr<RequestStream> stream,
                 const std::string& id, const std::string& model,
                 std::shared_ptr<const Tools> tools, bool streamed,
                 const GenerateOptions::Reasoning& reasoning) {
  auto split = std::make_shared<ReplySplitter>(reasoning);
  if (!streamed) {
    std::string text;
    while (!wait_watching_client(*stream, text, std::chrono::milliseconds(1000))) {
    }
    int status = 200;
    std::string error;
    if (failed(*stream, status, error)) {
      res.status = status;
      res.set_content(error_body(status, error), "application/json");
      return;
    }
    ReasoningSplitter::Piece parts = split->feed(text, /*last=*/true);
    const ToolReply reply =
        split->end(parts.content, *tools).value_or(ToolReply{std::move(parts.content), {}});
    const ojson m = message(message_head(id, model), reply, outcome(*stream), parts.reasoning);
    res.set_content(m.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  auto started_stream = std::make_shared<bool>(false);
  auto held = std::make_shared<std::string>();  // with tools: the whole reply
  const bool hold = split->holds_content(*tools);
  auto events = std::make_shared<StreamEvents>(message_head(id, model));
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, started_stream, held, hold, events, split, tools](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          stream->cancel();
          return false;
        };
        if (!*started_stream) {
          *started_stream = true;
          if (!send(events->start())) return false;
        }
        std::string text;
        const bool done = wait_watching_client(*stream, text, std::chrono::milliseconds(500));
        ReasoningSplitter::Piece p = split->feed(text, done);
        if (hold) {
          *held += p.content;
          p.content.clear();
        }
        const std::string out = events->thinking(p.reasoning) + events->text(p.content);
        if (!out.empty()) {
          if (!send(out)) return false;
        } else if (!done && !send(event({{"type", "ping"}}))) {  // finds a closed socket
          return false;
        }
        if (!done) return true;
        int status = 200;
        std::string error;
        if (failed(*stream, status, error)) {
          if (!send(error_event(status, error))) return false;
        } else {
          const std::optional<ToolReply> reply = split->end(*held, *tools);
          if (!send(events->end(reply ? &*reply : nullptr, outcome(*stream)))) return false;
        }
        sink.done();
        return true;
      },
      [stream](bool success) {
        if (!success) stream->cancel();
      });
}

}  // namespace edgellm::anthropic
