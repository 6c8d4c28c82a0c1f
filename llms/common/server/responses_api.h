// OpenAI's Responses API (POST /v1/responses) over the chat route, as the
// Messages API is (anthropic_messages.h): a request is translated into the chat
// request it means and served by the same checks, chat encoder and scheduler;
// the reply is written as a Response object or its typed stream events.
// Conversations continue through previous_response_id (responses_store.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/scheduler.h"
#include "edgellm/tool_calls.h"
#include "request_fields.h"

namespace httplib {
struct Response;
}

namespace edgellm::responses {

using protocol::ojson;

class Store;

using protocol::RequestError;

// A Responses request, checked. `input`: the new input as items (a string
// input becomes one user message item); `echo`: the request's settings as the
// Response object repeats them (instructions, tools, tool_choice, ...).
struct Request {
  ojson input;
  ojson echo;
  std::string previous_response_id;  // "" when none
  bool store = true;
  bool stream = false;
};

// Checks `body` (refusing fields and items this server does not implement,
// naming them) and reads it into a Request.
Request read_request(const ojson& body);

// Items checked and made plain, as the conversation keeps them: a message's
// content as one text, a function_call_output's output as one text, no ids or
// statuses. `where` names the list in refusals ("input"). The reply's own
// output items are read through it too, to continue after them.
ojson conversation_items(const ojson& items, const std::string& where);

// The OpenAI chat request `request` means after `history` (the previous
// response's items, input and output; empty when none): instructions as the
// first system message, then history and input items as chat messages
// (function_call items as the assistant's tool_calls, function_call_output
// items as tool messages), tools in chat's nested shape.
ojson to_chat_request(const ojson& body, const Request& request, const ojson& history);

// The name a chat request's field has in the Responses request a refusal of
// it must name (max_tokens -> max_output_tokens, messages[...] -> input).
std::string request_param(const std::string& chat_param);

// How a request ended, as the reply reports it.
struct Outcome {
  FinishReason finish = FinishReason::stop;
  size_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// "resp_", "msg_", "fc_" followed by 32 random hex digits: ids a stored
// conversation is read back by, so not guessable from another client's.
std::string new_id(const std::string& prefix);

// The Response object before its output (status "in_progress"): what
// response.created carries. `echo`: Request::echo.
ojson response_head(const std::string& id, const std::string& model, const ojson& echo);

// The output items of a finished reply: a message (when there is text, or no
// call), then one function_call item per call.
ojson output_items(const ToolReply& reply, const Outcome& outcome);

// The whole Response: `head` with its output, status ("incomplete" when
// max_output_tokens cut it, with incomplete_details), and usage.
ojson response(ojson head, const ojson& output, const Outcome& outcome);

// A streamed reply's typed events (`event: TYPE` / `data: JSON`), each with
// the next sequence_number: start() (response.created, response.in_progress);
// text() per piece (opening the message item and its output_text part on the
// first); end() (the open message's done events, or a `held` reply's items
// whole, then response.completed or response.incomplete); failed() ends a
// stream the engine failed (response.failed). output() is the items written.
class StreamEvents {
 public:
  explicit StreamEvents(ojson head) : head_(std::move(head)) {}
  std::string start();
  std::string text(const std::string& text);
  std::string end(const ToolReply* held, const Outcome& outcome);
  std::string failed(const std::string& message);
  const ojson& output() const { return output_; }

 private:
  void event(std::string& out, ojson data);
  void open_message(std::string& out);
  void delta(std::string& out, const std::string& text);
  void close_message(std::string& out, const Outcome& outcome);
  void call_events(std::string& out, const ToolCall& call, const Outcome& outcome);
  ojson head_;
  ojson output_ = ojson::array();
  size_t sequence_ = 0;
  std::string message_id_, text_;  // the open message item's (id empty: none open)
};

// Writes the reply to a submitted request on `edgellm serve` (responses_reply.cpp):
// one Response object, or (`streamed`) its events, text deltas as they come
// (with tools, held to the end). An engine failure or the shutdown is an error
// reply (response.failed once streaming). A failed write cancels the request.
// A reply that ends normally is kept in `store` (null: store false) under the
// head's id as `conversation` (history and input items) with its output items.
void write_reply(httplib::Response& res, std::shared_ptr<RequestStream> stream, ojson head,
                 std::shared_ptr<const Tools> tools, bool streamed, Store* store,
                 ojson conversation);

}  // namespace edgellm::responses
