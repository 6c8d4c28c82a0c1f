// Tool calling in the Python binding (edgellm/tool_calls.h), so that the Ray
// Serve replicas check tools, render them and parse calls with the engine's one
// implementation, as edgellm serve does. JSON crosses as text.
#include "tools.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <type_traits>

#include "edgellm/json_file.h"
#include "edgellm/reply_splitter.h"
#include "edgellm/tool_calls.h"
#include "serving.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using json = nlohmann::json;
using CallTuple = std::tuple<std::string, std::string, std::string>;  // (id, name, arguments)

nb::handle tool_error_type;

template <typename Fn>
auto tool_errors(Fn fn) {
  return with_tool_errors(fn);
}

template <typename J = json>
J parse(const std::string& text, const char* what) {
  if (text.empty()) return nullptr;
  if constexpr (std::is_same_v<J, json>)
    return edgellm::parse_json(text, what);
  else
    return edgellm::parse_ordered_json(text, what);  // bounded, linear in the keys
}

std::vector<CallTuple> tuples(const std::vector<edgellm::ToolCall>& calls) {
  std::vector<CallTuple> out;
  for (const edgellm::ToolCall& c : calls) out.emplace_back(c.id, c.name, c.arguments);
  return out;
}

}  // namespace

void raise_tool_error(const edgellm::ToolRequestError& e) {
  nb::object error = nb::borrow(tool_error_type)(e.what());
  error.attr("param") = e.param();
  PyErr_SetObject(tool_error_type.ptr(), error.ptr());
  throw nb::python_error();
}

void bind_tools(nb::module_& m, nb::handle error) {
  tool_error_type = PyErr_NewException("edgellm.ToolRequestError", error.ptr(), nullptr);
  m.attr("ToolRequestError") = tool_error_type;

  nb::class_<edgellm::Tools>(m, "Tools", "A request's tools and tool_choice, checked.")
      .def(nb::init<>())
      .def_static(
          "parse",
          [](const std::string& tools, const std::string& tool_choice,
             const std::string& parallel_tool_calls) {
            return tool_errors([&] {
              using O = nlohmann::ordered_json;  // the declared order of parameters
              return edgellm::parse_tools(parse<O>(tools, "tools"),
                                          parse<O>(tool_choice, "tool_choice"),
                                          parse<O>(parallel_tool_calls, "parallel_tool_calls"));
            });
          },
          "tools"_a = "", "tool_choice"_a = "", "parallel_tool_calls"_a = "",
          "From the request fields as JSON text ('' = absent). Raises ToolRequestError, its "
          "param naming the bad field.")
      .def_prop_ro("active", &edgellm::Tools::active,
                   "tools reach the prompt and the reply is parsed for calls")
      .def_prop_ro("forced", &edgellm::Tools::forced,
                   "the reply must be one call (tool_choice required or a named function)")
      .def(
          "call_grammar",
          [](const edgellm::Tools& t) -> std::optional<PyGrammar> {
            if (!t.forced()) return std::nullopt;
            return PyGrammar{with_tool_errors([&] { return edgellm::call_grammar(t); })};
          },
          "The grammar= of a forced call (None when the call is not forced); parameters "
          "structured output cannot enforce raise ToolRequestError naming them.")
      .def_prop_ro(
          "call_schema", [](const edgellm::Tools& t) { return edgellm::call_schema(t).dump(); },
          "the JSON schema (text) a forced reply is constrained to");

  m.def(
      "parse_tool_calls",
      [](const std::string& tool_calls, const std::string& where) {
        return tool_errors([&] {
          return tuples(edgellm::parse_tool_calls(parse(tool_calls, "tool_calls"), where));
        });
      },
      "tool_calls"_a, "where"_a,
      "An assistant message's tool_calls (JSON text) as [(id, name, arguments)]; `where` names "
      "the field in a ToolRequestError.");

  m.def(
      "parse_tool_output",
      [](const std::string& text, const edgellm::Tools& tools) {
        const edgellm::ToolReply r = edgellm::parse_tool_output(text, tools);
        return std::make_tuple(r.content, tuples(r.calls));
      },
      "text"_a, "tools"_a,
      "The model's reply as (content, [(id, name, arguments)]); no calls: a plain reply.");

  using edgellm::ReplySplitter;
  nb::class_<ReplySplitter>(m, "ReplySplitter",
                            "A chat reply's text read the one way its template writes it "
                            "(edgellm/reply_splitter.h): <think> blocks, harmony channels and "
                            "calls, or plain content.")
      .def(
          "__init__",
          [](ReplySplitter* self, std::optional<PyReasoning> reasoning) {
            new (self) ReplySplitter(reasoning_of(reasoning));
          },
          "reasoning"_a.none(), "reasoning: chat_reasoning()'s rules (None: plain content).")
      .def(
          "feed",
          [](ReplySplitter& s, std::string_view text, bool last) {
            edgellm::ReasoningSplitter::Piece p = s.feed(text, last);
            return std::make_tuple(std::move(p.reasoning), std::move(p.content));
          },
          "text"_a, "last"_a = false,
          "(reasoning, content) that became final; last: the reply ended, nothing is held.")
      .def("holds_content", &ReplySplitter::holds_content, "tools"_a,
           "Whether content must be held until the reply ends (its calls are parsed from it).")
      .def(
          "end",
          [](const ReplySplitter& s, std::string content, const edgellm::Tools& tools) {
            std::optional<std::tuple<std::string, std::vector<CallTuple>>> out;
            if (std::optional<edgellm::ToolReply> r = s.end(std::move(content), tools))
              out.emplace(std::move(r->content), tuples(r->calls));
            return out;
          },
          "content"_a, "tools"_a,
          "After the last feed: (content, [(id, name, arguments)]) of the reply's end, where "
          "content is what was held (or the whole content); None when nothing is read there.");
}
