// edgellm_deployment: the deployment policy (llms/common/deployment.h) for the
// Python front ends in llms/ (the verify adapters), so that `make run` and
// `make verify` resolve --model and pick the prompt format with one
// implementation. Built from llms/, beside the engine's binding (edgellm_py),
// which knows nothing of deployments.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "deployment.h"
#include "edgellm/error.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(edgellm_deployment, m) {
  m.doc() = "The deployment descriptors (llms/<name>/deployment.json) and the --model policy";
  nb::exception<edgellm::Error>(m, "Error", PyExc_RuntimeError);
  // A front end built from this tree: its models/ is the default store.
  edgellm::use_source_model_store();
  m.def("model_store", &edgellm::model_store,
        "$EDGELLM_MODELS, else the source tree's models/ (the engine's rule, this tree's default)");
  m.def("llms_dir", &edgellm::llms_dir, "llms/ of the source tree this module was built from");
  m.def("names", &edgellm::Deployment::names,
        "the deployments: folders of llms/ with a descriptor");
  nb::class_<edgellm::Deployment>(m, "Deployment")
      .def_static("load", &edgellm::Deployment::load, "file"_a)
      .def_static("load_named", &edgellm::Deployment::load_named, "name"_a)
      .def_ro("name", &edgellm::Deployment::name)
      .def_ro("models", &edgellm::Deployment::models)
      .def_ro("default_model", &edgellm::Deployment::default_model)
      .def_ro("default_prompt", &edgellm::Deployment::default_prompt)
      .def_ro("max_context", &edgellm::Deployment::max_context)
      .def_ro("hidden_act", &edgellm::Deployment::hidden_act)
      .def("resolve_model", &edgellm::Deployment::resolve_model, "choice"_a)
      .def_static("variant", &edgellm::Deployment::variant, "model_dir"_a, "choice"_a)
      .def(
          "prompt_format",
          [](const edgellm::Deployment& d, const std::filesystem::path& dir,
             const std::string& choice) {
            return d.prompt_format_for(dir, choice) == edgellm::PromptFormat::chat ? "chat" : "raw";
          },
          "model_dir"_a, "choice"_a, "chat or raw: how prompts reach this checkpoint");
}
