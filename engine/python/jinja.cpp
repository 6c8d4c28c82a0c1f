// render_jinja: one template rendered with one JSON context, so that the tests
// can hold our interpreter to Python jinja2 byte for byte. `fault` switches on
// one fault-injection mutant for this call only (the tests' proof that the
// comparison catches it).
#include "jinja.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "edgellm/jinja.h"
#include "edgellm/json_file.h"
#include "jinja/fault_injection.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct FaultScope {
  explicit FaultScope(edgellm::jinja::fault::Fault f) { edgellm::jinja::fault::set(f); }
  ~FaultScope() { edgellm::jinja::fault::set(edgellm::jinja::fault::Fault::none); }
};

}  // namespace

void bind_jinja(nb::module_& m) {
  // TemplateRaised: the template's raise_exception (its message alone, as jinja2 has it).
  static nb::object template_error = nb::borrow(PyErr_NewException(
      (std::string(nb::cast<std::string>(m.attr("__name__"))) + ".TemplateError").c_str(),
      PyExc_ValueError, nullptr));
  static nb::object template_raised = nb::borrow(PyErr_NewException(
      (std::string(nb::cast<std::string>(m.attr("__name__"))) + ".TemplateRaised").c_str(),
      template_error.ptr(), nullptr));
  m.attr("TemplateError") = template_error;
  m.attr("TemplateRaised") = template_raised;
  m.def(
      "render_jinja",
      [](std::string_view source, std::string_view context_json, std::optional<int64_t> now,
         std::string_view fault) {
        namespace j = edgellm::jinja;
        if (fault != "none" && j::fault::from_name(fault) == j::fault::Fault::none)
          throw nb::value_error("unknown fault");
        FaultScope scope(j::fault::from_name(fault));
        try {
          j::Options opt;
          if (now) opt.now = static_cast<std::time_t>(*now);
          const auto context = edgellm::parse_ordered_json(context_json, "the context");
          const j::Template t = j::Template::parse(source, opt);
          nb::gil_scoped_release release;
          return t.render(context);
        } catch (const j::RaisedError& e) {
          PyErr_SetString(template_raised.ptr(), e.detail().c_str());
          throw nb::python_error();
        } catch (const j::TemplateError& e) {
          PyErr_SetString(template_error.ptr(), e.what());
          throw nb::python_error();
        } catch (const nlohmann::json::exception& e) {
          throw nb::value_error(e.what());
        }
      },
      "template"_a, "context_json"_a, "now"_a = nb::none(), "fault"_a = "none",
      "Renders a Jinja template with a JSON object of variables (strftime_now in UTC at `now` "
      "when given); TemplateError (a ValueError) on any failure, TemplateRaised with the "
      "template's own message on raise_exception.");
}
