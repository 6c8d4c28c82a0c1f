// edgellm_anthropic: the Messages API's shapes (llms/common/server/
// anthropic_messages.h) for the Ray ingress, so that both servers translate a
// request and write its reply with one implementation. JSON goes in and out as
// text.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "server/anthropic_messages.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace an = edgellm::anthropic;

namespace {

using Calls = std::vector<std::tuple<std::string, std::string, std::string>>;

edgellm::ToolReply reply_of(const std::string& content, const Calls& calls) {
  edgellm::ToolReply r{content, {}};
  for (const auto& [id, name, arguments] : calls) r.calls.push_back({id, name, arguments});
  return r;
}

an::Outcome outcome_of(const std::string& finish, const std::string& stop_string,
                       size_t prompt_tokens, size_t cached_tokens, size_t completion_tokens) {
  return {finish == "length" ? edgellm::FinishReason::length : edgellm::FinishReason::stop,
          stop_string, prompt_tokens, cached_tokens, completion_tokens};
}

std::string dump(const an::ojson& j) {
  return j.dump(-1, ' ', false, an::ojson::error_handler_t::replace);
}

}  // namespace

NB_MODULE(edgellm_anthropic, m) {
  m.doc() = "Anthropic's Messages API as shapes: request translation, reply and stream events";
  m.def(
      "to_chat_request",
      [](const std::string& body) -> std::tuple<std::string, std::string, std::string> {
        try {
          return {dump(an::to_chat_request(an::ojson::parse(body))), "", ""};
        } catch (const an::RequestError& e) {
          return {"", e.param(), e.what()};
        }
      },
      "body"_a,
      "(the chat request's JSON text, '', '') or ('', param, message) for a request refused");
  m.def(
      "message",
      [](const std::string& id, const std::string& model, const std::string& content,
         const Calls& calls, const std::string& finish, const std::string& stop_string,
         size_t prompt_tokens, size_t cached_tokens, size_t completion_tokens,
         const std::string& thinking) {
        return dump(an::message(
            an::message_head(id, model), reply_of(content, calls),
            outcome_of(finish, stop_string, prompt_tokens, cached_tokens, completion_tokens),
            thinking));
      },
      "id"_a, "model"_a, "content"_a, "calls"_a, "finish"_a, "stop_string"_a, "prompt_tokens"_a,
      "cached_tokens"_a, "completion_tokens"_a, "thinking"_a = "", "the whole reply's JSON text");
  nb::class_<an::StreamEvents>(m, "StreamEvents", "a streamed reply's events, blocks indexed")
      .def(
          "__init__",
          [](an::StreamEvents* self, const std::string& id, const std::string& model) {
            new (self) an::StreamEvents(an::message_head(id, model));
          },
          "id"_a, "model"_a)
      .def("start", &an::StreamEvents::start)
      .def("thinking", &an::StreamEvents::thinking, "text"_a)
      .def("text", &an::StreamEvents::text, "text"_a)
      .def(
          "end",
          [](an::StreamEvents& self, bool held, const std::string& content, const Calls& calls,
             const std::string& finish, const std::string& stop_string, size_t prompt_tokens,
             size_t cached_tokens, size_t completion_tokens) {
            const edgellm::ToolReply reply = reply_of(content, calls);
            return self.end(held ? &reply : nullptr, outcome_of(finish, stop_string, prompt_tokens,
                                                                cached_tokens, completion_tokens));
          },
          "held"_a, "content"_a, "calls"_a, "finish"_a, "stop_string"_a, "prompt_tokens"_a,
          "cached_tokens"_a, "completion_tokens"_a);
  m.def("error_body", &an::error_body, "status"_a, "message"_a);
  m.def("error_event", &an::error_event, "status"_a, "message"_a);
}
