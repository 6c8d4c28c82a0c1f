// Anthropic's Messages API (POST /v1/messages) over the OpenAI chat route: a
// request is translated into the chat request it means, then served by the
// same checks, chat encoder and scheduler; the reply is written in Anthropic's
// shapes (content blocks, stop_reason, usage, its stream events and errors).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "edgellm/scheduler.h"
#include "edgellm/tool_calls.h"
#include "request_fields.h"

namespace httplib {
struct Response;
}

namespace edgellm::anthropic {

using protocol::ojson;

using protocol::RequestError;

// The OpenAI chat request `body` (a Messages request) means: system and
// messages (text, tool_use and tool_result blocks) become chat messages,
// tools and tool_choice their OpenAI forms, stop_sequences `stop`. Fields and
// blocks this server does not implement are refused, naming them.
ojson to_chat_request(const ojson& body);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use".
std::string stop_reason(FinishReason finish, const std::string& stop_string, bool tool_use);

// The reply's content blocks: a reasoning model's thinking (when there is
// any), its text (when there is any), then one tool_use block per call,
// `input` the call's arguments as a JSON object.
ojson content_blocks(const std::string& text, const std::vector<ToolCall>& calls,
                     const std::string& thinking = "");

// usage: input_tokens counts the prompt tokens not read from the prefix cache,
// cache_read_input_tokens those that were (Anthropic's split).
ojson usage(size_t prompt_tokens, size_t cached_tokens, size_t output_tokens);

// {"type": "error", "error": {"type": ..., "message": ...}} for an HTTP status.
std::string error_body(int status, const std::string& message);

// One server-sent event: "event: TYPE\ndata: JSON\n\n" (`data` carries "type": TYPE).
std::string event(const ojson& data);

// How a request ended, as the reply reports it.
struct Outcome {
  FinishReason finish = FinishReason::stop;
  std::string stop_string;  // the stop sequence that ended the text, if one did
  size_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// The message object before its content: what message_start carries.
ojson message_head(const std::string& id, const std::string& model);

// The whole reply (not streamed): `head` with its content blocks, stop_reason,
// stop_sequence and usage.
ojson message(ojson head, const ToolReply& reply, const Outcome& outcome,
              const std::string& thinking = "");

// A streamed reply's events, in order, each content block at its index:
// start() (message_start, a ping); thinking() and text() for each piece as it
// comes, each opening its block when it is not open (a thinking block comes
// first, and the text one closes it); end() (the open block's stop, a `held`
// reply's text and tool_use blocks whole, message_delta with stop_reason and
// usage, message_stop). A reply not held always has a text block, as the
// whole message has. error_event ends a stream that failed.
class StreamEvents {
 public:
  explicit StreamEvents(ojson head) : head_(std::move(head)) {}
  std::string start() const;
  std::string thinking(const std::string& text);
  std::string text(const std::string& text);
  std::string end(const ToolReply* held, const Outcome& outcome);

 private:
  enum class Block { none, thinking, text };
  std::string open(Block block);  // closes the open one first
  std::string close();
  ojson head_;
  Block open_ = Block::none;
  size_t index_ = 0;  // the open block's, else the next one's
  bool had_text_ = false;
};
std::string error_event(int status, const std::string& message);

// Writes the reply to a submitted request on `edgellm serve`
// (anthropic_reply.cpp): one message object, or (`streamed`) its events, text
// deltas as they come (with tools, held to the end). An engine failure or the
// shutdown is an error reply (an error event once streaming). `id`, `model`:
// the message's. A failed write cancels the request.
// `reasoning`: the request's reasoning rules, which choose how the reply is
// split into thinking, text and calls (edgellm/reply_splitter.h).
void write_reply(httplib::Response& res, std::shared_ptr<RequestStream> stream,
                 const std::string& id, const std::string& model,
                 std::shared_ptr<const Tools> tools, bool streamed,
                 const GenerateOptions::Reasoning& reasoning = {});

}  // namespace edgellm::anthropic
