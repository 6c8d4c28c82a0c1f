// Python binding of the engine (nanobind). The verify adapters call the same
// Session::setup / prefill / decode_step that the inference programs use.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "edgellm/error.h"
#include "edgellm/roofline.h"
#include "edgellm/session.h"
#include "edgellm/tokenizer.h"
#include "io/gguf.h"
#include "kernels/kernels.h"
#include "models/gguf_weights.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using FloatArray = nb::ndarray<nb::numpy, float, nb::ndim<1>>;
using FloatMatrix = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// Copies into a NumPy-owned array: the engine reuses its logits buffer.
FloatArray to_numpy(std::span<const float> values) {
  auto* data = new float[values.size()];
  std::copy(values.begin(), values.end(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return FloatArray(data, {values.size()}, owner);
}

FloatMatrix to_numpy(std::vector<float>&& values, size_t rows, size_t cols) {
  auto* data = new std::vector<float>(std::move(values));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return FloatMatrix(data->data(), {rows, cols}, owner);
}

}  // namespace

NB_MODULE(edgellm_py, m) {
  m.doc() = "edgellm engine binding";
  nb::exception<edgellm::Error>(m, "Error", PyExc_RuntimeError);

  m.def("active_isa",
        [] { return std::string(edgellm::kernels::isa_name(edgellm::kernels::active_isa())); });

  m.def("registered_kernels", [] {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (const auto& k : edgellm::kernels::registered_kernels()) {
      std::vector<std::string> paths;
      for (auto isa : k.paths) paths.emplace_back(edgellm::kernels::isa_name(isa));
      out.emplace_back(std::string(k.name), paths);
    }
    return out;
  });

  m.def(
      "measure_roofline",
      [](int threads) {
        const edgellm::Roofline r = edgellm::measure_roofline(threads);
        return nb::make_tuple(r.read_gb_per_s, r.fma_gflop_per_s);
      },
      "threads"_a, "(read GB/s, FMA GFLOP/s) measured now");

  m.def(
      "gguf_dequantize",
      [](const std::filesystem::path& path, const std::string& name, size_t max_rows) {
        const auto g = edgellm::GgufFile::open(path);
        const edgellm::GgufTensor* t = g.find(name);
        if (!t) throw edgellm::Error(path.string() + ": no tensor '" + name + "'");
        auto values = edgellm::dequantize_gguf_tensor(*t, max_rows);
        const size_t rows = values.size() / t->cols();
        return to_numpy(std::move(values), rows, t->cols());
      },
      "path"_a, "tensor"_a, "max_rows"_a = 0,
      "a quantized GGUF tensor as the kernels use it: fp32 [rows, cols], GGUF row order "
      "(max_rows > 0: only the first rows)");

  nb::class_<edgellm::Tokenizer>(m, "Tokenizer")
      .def_static("load", &edgellm::Tokenizer::load, "model_dir"_a)
      .def("encode", &edgellm::Tokenizer::encode, "text"_a, "add_special_tokens"_a = false)
      .def(
          "decode",
          [](const edgellm::Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
            return t.decode(ids, skip);
          },
          "ids"_a, "skip_special_tokens"_a = false)
      .def("token_to_id", &edgellm::Tokenizer::token_to_id)
      .def("vocab_size", &edgellm::Tokenizer::vocab_size);

  nb::class_<edgellm::ChatTemplate>(m, "ChatTemplate")
      .def_static("load", &edgellm::ChatTemplate::load, "model_dir"_a)
      .def("available", &edgellm::ChatTemplate::available)
      .def("name", &edgellm::ChatTemplate::name)
      .def(
          "render",
          [](const edgellm::ChatTemplate& t,
             const std::vector<std::pair<std::string, std::string>>& msgs,
             bool add_generation_prompt) {
            std::vector<edgellm::ChatMessage> messages;
            for (const auto& [role, content] : msgs) messages.push_back({role, content});
            return t.render(messages, add_generation_prompt);
          },
          "messages"_a, "add_generation_prompt"_a = true);

  nb::class_<edgellm::Session>(m, "Session")
      .def(nb::init<>())
      .def(
          "setup",
          [](edgellm::Session& s, const std::filesystem::path& dir, int threads, int max_context,
             bool profile, const std::string& weights) {
            edgellm::SessionOptions o;
            o.threads = threads;
            o.max_context = max_context;
            o.profile = profile;
            o.weights = weights;
            nb::gil_scoped_release release;
            s.setup(dir, o);
          },
          "model_dir"_a, "threads"_a = 0, "max_context"_a = 4096, "profile"_a = false,
          "weights"_a = "")
      .def(
          "prefill",
          [](edgellm::Session& s, const std::vector<int32_t>& tokens, int start_pos) {
            std::span<const float> logits;
            {
              nb::gil_scoped_release release;
              logits = s.prefill(tokens, start_pos);
            }
            return to_numpy(logits);
          },
          "tokens"_a, "start_pos"_a = 0)
      .def(
          "prefill_capture",
          [](edgellm::Session& s, const std::vector<int32_t>& tokens) {
            edgellm::PrefillCapture capture;
            std::span<const float> logits;
            {
              nb::gil_scoped_release release;
              logits = s.prefill(tokens, 0, &capture);
            }
            const size_t hidden = static_cast<size_t>(s.config().hidden_size);
            nb::list layers;
            for (auto& l : capture.layer_outputs)
              layers.append(to_numpy(std::move(l), tokens.size(), hidden));
            return nb::make_tuple(to_numpy(logits), layers,
                                  to_numpy(std::move(capture.final_hidden), tokens.size(), hidden));
          },
          "tokens"_a)
      .def(
          "decode_step",
          [](edgellm::Session& s, int32_t token, int pos) {
            std::span<const float> logits;
            {
              nb::gil_scoped_release release;
              logits = s.decode_step(token, pos);
            }
            return to_numpy(logits);
          },
          "token"_a, "pos"_a)
      .def_prop_ro("tokenizer", &edgellm::Session::tokenizer, nb::rv_policy::reference_internal)
      .def_prop_ro("chat_template", &edgellm::Session::chat_template,
                   nb::rv_policy::reference_internal)
      .def_prop_ro("max_context", &edgellm::Session::max_context)
      .def_prop_ro("weight_bytes", &edgellm::Session::weight_bytes)
      .def_prop_ro("vocab_size", [](const edgellm::Session& s) { return s.config().vocab_size; })
      .def_prop_ro("num_layers", [](const edgellm::Session& s) { return s.config().num_layers; })
      .def_prop_ro("hidden_size", [](const edgellm::Session& s) { return s.config().hidden_size; })
      .def_prop_ro("eos_token_ids",
                   [](const edgellm::Session& s) { return s.config().eos_token_ids; });
}
