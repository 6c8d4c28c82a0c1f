// The Responses API's reply on `edgellm serve`: a submitted request's stream
// written through httplib as one Response object or as its typed events, with
// the shapes of responses_api.h; a reply that ends normally is stored for
// previous_response_id (responses_store.h).
#include <chrono>

#include <httplib.h>

#include "api_error.h"
#include "request_wait.h"
#include "responses_api.h"
#include "responses_store.h"

namespace edgellm::responses {

namespace {

constexpr const char* kShutdownMessage =
    "the server shut down before the request finished; retry it";

Outcome outcome(const RequestStream& s) {
  return {s.finish, s.prompt_tokens, s.cached_tokens, s.completion_tokens};
}

// The text and calls a finished reply holds (calls only when tools are active).
ToolReply read_reply(const std::string& text, const Tools& tools) {
  return tools.active() ? parse_tool_output(text, tools) : ToolReply{text, {}};
}

// A request the engine failed or the shutdown cancelled: its error.
bool failed(const RequestStream& s, ApiError& error) {
  if (s.error.empty() && s.finish != FinishReason::cancelled) return false;
  error = s.error.empty() ? ApiError{503, kShutdownMessage, "", "server_shutdown"}
                          : ApiError{500, s.error, "", ""};
  return true;
}

// The conversation a later request continues: `conversation` and the reply's output.
void keep(Store* store, const ojson& head, ojson conversation, const ojson& output) {
  if (!store) return;
  for (ojson& item : conversation_items(output, "output")) conversation.push_back(std::move(item));
  store->put(head["id"], std::move(conversation));
}

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

void write_reply(httplib::Response& res, std::shared_ptr<RequestStream> stream, ojson head,
                 std::shared_ptr<const Tools> tools, bool streamed, Store* store,
                 ojson conversation) {
  if (!streamed) {
    std::string text;
    while (!wait_watching_client(*stream, text, std::chrono::milliseconds(1000))) {
    }
    if (ApiError error; failed(*stream, error)) throw error;
    const Outcome o = outcome(*stream);
    const ojson output = output_items(read_reply(text, *tools), o);
    keep(store, head, std::move(conversation), output);
    res.set_content(dump(response(std::move(head), output, o)), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  auto started = std::make_shared<bool>(false);
  auto held = std::make_shared<std::string>();  // with tools: the whole reply
  const bool hold = tools->active();
  auto events = std::make_shared<StreamEvents>(head);
  auto kept = std::make_shared<ojson>(std::move(conversation));
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, started, held, hold, events, tools, store, kept, head](size_t,
                                                                      httplib::DataSink& sink) {
        auto send = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          stream->cancel();
          return false;
        };
        if (!*started) {
          *started = true;
          if (!send(events->start())) return false;
        }
        std::string text;
        const bool done = wait_watching_client(*stream, text, std::chrono::milliseconds(500));
        if (hold) {
          *held += text;
          text.clear();
        }
        const std::string out = events->text(text);
        // An SSE comment while nothing comes (queued, long prefill) finds a closed socket.
        if ((!out.empty() || !done) && !send(out.empty() ? std::string(": waiting\n\n") : out))
          return false;
        if (!done) return true;
        if (ApiError error; failed(*stream, error)) {
          if (!send(events->failed(error.message))) return false;
        } else {
          const ToolReply reply = read_reply(*held, *tools);
          const std::string last = events->end(hold ? &reply : nullptr, outcome(*stream));
          // Stored before the client reads the end: its next request may continue it at once.
          keep(store, head, std::move(*kept), events->output());
          if (!send(last)) return false;
        }
        sink.done();
        return true;
      },
      [stream](bool success) {
        if (!success) stream->cancel();
      });
}

}  // namespace edgellm::responses
