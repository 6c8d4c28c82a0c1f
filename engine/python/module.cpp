// Python binding of the engine (nanobind). The verify adapters call the same
// Session::setup / prefill / decode_step that the inference programs use.
// Built twice from this file: build/python/edgellm_py (the verify adapters) and
// edgellm._core, the extension of the installable `edgellm` package.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "edgellm/error.h"
#include "edgellm/generate.h"
#include "edgellm/json_file.h"
#include "edgellm/json_grammar.h"
#include "edgellm/model_store.h"
#include "edgellm/pooling.h"
#include "edgellm/roofline.h"
#include "edgellm/session.h"
#include "edgellm/tokenizer.h"
#include "edgellm/tool_calls.h"
#include "io/gguf.h"
#include "jinja.h"
#include "kernels/avx512.h"
#include "kernels/fault_injection.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "models/gguf_weights.h"
#include "serving.h"
#include "tools.h"

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

// A running generate(): each __next__ runs one Generator step (the prefill
// first) with the GIL released and returns the text that became final.
class TextStream {
 public:
  TextStream(edgellm::Context& context, std::vector<int32_t> prompt,
             const edgellm::GenerateOptions& options, int start_pos)
      : gen_(context, std::move(prompt), options, start_pos) {}

  std::string next() {
    if (gen_.done()) throw nb::stop_iteration();
    nb::gil_scoped_release release;
    return gen_.step().text;
  }

  const edgellm::Generation& generation() const { return gen_.generation(); }
  int position() const { return gen_.position(); }

 private:
  edgellm::Generator gen_;
};

// generate() run to the end, with its timing and, on request, every sampled
// token's logits (the verify gate's per-step records) and the prefill capture.
struct GenerateRun {
  edgellm::GenerateResult result;
  std::vector<int32_t> sampled;  // every sampled token: output, stop and unseen ones
  std::vector<float> logits;     // [sampled.size() * vocab] when recorded
  size_t vocab = 0;
  bool captured = false;
  edgellm::PrefillCapture capture;
};

// The options generate() and generate_timed() share, from their Python keyword arguments.
edgellm::GenerateOptions generate_options(int max_tokens, float temperature, int top_k, float top_p,
                                          uint64_t seed, std::vector<std::string> stop,
                                          std::vector<int32_t> stop_tokens, bool stop_at_eos) {
  edgellm::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling = {temperature, top_k, top_p, seed};
  o.stop_strings = std::move(stop);
  o.stop_tokens = std::move(stop_tokens);
  o.stop_at_eos = stop_at_eos;
  return o;
}

// SessionOptions from setup()'s keyword arguments; with use_environment the
// empty ones take the EDGELLM_* defaults, as the command-line programs do.
edgellm::SessionOptions session_options(int threads, int max_context, bool profile,
                                        const std::string& weights, const std::string& kv_cache,
                                        const std::string& precision,
                                        const std::string& gemm_precision,
                                        const std::string& attn_precision,
                                        const std::string& quant_activations,
                                        const std::string& isa, bool use_environment) {
  edgellm::SessionOptions o;
  o.threads = threads;
  o.max_context = max_context;
  o.profile = profile;
  o.weights = weights;
  o.kv_cache = kv_cache;
  o.precision = precision;
  o.gemm_precision = gemm_precision;
  o.attn_precision = attn_precision;
  o.quant_activations = quant_activations;
  o.isa = isa;
  return use_environment ? edgellm::with_environment_defaults(o) : o;
}

// The resolved config as a dict, for reports and the gate.
nb::dict exec_config_dict(const edgellm::kernels::ExecConfig& c) {
  namespace k = edgellm::kernels;
  nb::dict d;
  d["isa"] = std::string(k::isa_name(c.isa));
  d["gemm"] = std::string(k::gemm_activation_dtype(c));
  d["attention"] = std::string(k::attn_precision_name(c.attention));
  d["kv_cache"] = std::string(k::kv_dtype_name(c.kv));
  d["quant_activations"] = k::quant_activation_dtype(c);
  d["exact"] = c.exact();
  d["description"] = edgellm::describe_exec_config(c);
  return d;
}

// OpenAI chat messages as JSON text, read as the server reads them
// (edgellm::parse_chat_messages: ToolRequestError naming the field).
std::vector<edgellm::ChatMessage> openai_messages(std::string_view messages_json) {
  return edgellm::parse_chat_messages(nlohmann::json::parse(messages_json));
}

}  // namespace

// NB_MODULE pastes its name: the indirection lets CMake choose it.
#ifndef EDGELLM_MODULE_NAME
#define EDGELLM_MODULE_NAME edgellm_py
#endif
#define EDGELLM_NB_MODULE(name, var) NB_MODULE(name, var)

EDGELLM_NB_MODULE(EDGELLM_MODULE_NAME, m) {
  m.doc() = "edgellm engine binding";
  nb::exception<edgellm::Error> error(m, "Error", PyExc_RuntimeError);
  bind_tools(m, error);
  bind_jinja(m);
  // An edgellm.Error (as every input error) and a ValueError (as before).
  nb::exception<edgellm::JsonSchemaError>(m, "JsonSchemaError",
                                          nb::make_tuple(error, nb::handle(PyExc_ValueError)));
  nb::class_<PyGrammar>(m, "JsonGrammar",
                        "A compiled JSON schema: generate(..., grammar=) keeps the output a "
                        "document it accepts.");
  m.def(
      "compile_json_schema",
      [](std::string_view schema) { return PyGrammar{edgellm::compile_json_schema(schema)}; },
      "schema"_a,
      "The grammar of a JSON schema (its JSON text); JsonSchemaError (a ValueError) names a "
      "construct it cannot enforce.");
  m.def(
      "compile_response_format",
      [](std::string_view response_format) -> std::optional<PyGrammar> {
        auto g = edgellm::response_format_grammar(response_format);
        if (!g) return std::nullopt;
        return PyGrammar{std::move(g)};
      },
      "response_format"_a,
      "OpenAI's response_format (its JSON text) as a grammar: None for {\"type\": \"text\"}, any "
      "JSON object for json_object, the schema for json_schema; JsonSchemaError names what it "
      "cannot enforce.");
  m.def("grammar_index_builds", &edgellm::grammar_index_builds,
        "Vocabulary indexes for the token masks built so far in this process (a Scheduler "
        "builds its model's at construction, so a constrained request does not).");

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
      "kernel_table",
      [] {
        nb::list out;
        for (const auto& k : edgellm::kernels::registered_kernels()) {
          nb::list paths;
          for (auto isa : k.paths) paths.append(std::string(edgellm::kernels::isa_name(isa)));
          nb::dict row;
          row["name"] = nb::str(k.name.data(), k.name.size());
          row["paths"] = paths;
          row["dtypes"] = nb::str(k.dtypes.data(), k.dtypes.size());
          row["shapes"] = nb::str(k.shapes.data(), k.shapes.size());
          row["used_when"] = nb::str(k.used_when.data(), k.used_when.size());
          out.append(row);
        }
        return out;
      },
      "registered_kernels() with the registry's columns, for kernel_registry/generate.py");

  m.def(
      "set_kernel_fault",
      [](std::string_view name) {
        namespace f = edgellm::kernels::fault;
        const f::Fault fault = f::from_name(name);
        if (name != "none" && fault == f::Fault::none) throw nb::value_error("unknown fault");
        f::set(fault);
      },
      "name"_a,
      "Tests only: switches on one fault-injection mutant (kernels/fault_injection.h, by its "
      "name) for the whole process, or 'none'.");

  m.def("detected_isa",
        [] { return std::string(edgellm::kernels::isa_name(edgellm::kernels::detect_isa())); });

  m.def(
      "measure_roofline",
      [](int threads, const std::string& gemm_precision) {
        namespace k = edgellm::kernels;
        k::ExecConfig cfg = k::process_exec_config();
        if (!gemm_precision.empty()) {
          const auto p = k::parse_gemm_precision(gemm_precision);
          if (!p)
            throw edgellm::Error("gemm_precision " + gemm_precision + ": expected fp32 or bf16");
          cfg.gemm = *p;
        }
        const edgellm::Roofline r = edgellm::measure_roofline(threads, cfg);
        return nb::make_tuple(r.read_gb_per_s, r.fma_gflop_per_s);
      },
      "threads"_a, "gemm_precision"_a = "",
      "(read GB/s, GEMM-instruction GFLOP/s at that precision: fp32 FMA or bf16 dot) measured now");

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
      .def_static("from_gguf", &edgellm::Tokenizer::from_gguf, "gguf_file"_a)
      .def("encode",
           nb::overload_cast<std::string_view, bool>(&edgellm::Tokenizer::encode, nb::const_),
           "text"_a, "add_special_tokens"_a = false)
      .def(
          "decode",
          [](const edgellm::Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
            return t.decode(ids, skip);
          },
          "ids"_a, "skip_special_tokens"_a = false)
      .def(
          "token_bytes",
          [](const edgellm::Tokenizer& t, int32_t id) {
            const std::string bytes = t.token_bytes(id);
            return nb::bytes(bytes.data(), bytes.size());
          },
          "id"_a, "one token's raw bytes: part of a character stays as it is (decode: U+FFFD)")
      .def("token_to_id", &edgellm::Tokenizer::token_to_id)
      .def("vocab_size", &edgellm::Tokenizer::vocab_size);

  nb::class_<edgellm::ChatTemplate>(m, "ChatTemplate")
      .def_static("load", &edgellm::ChatTemplate::load, "model_dir"_a)
      .def_static("from_gguf", &edgellm::ChatTemplate::from_gguf, "gguf_file"_a)
      .def_static("from_text", &edgellm::ChatTemplate::from_text, "template"_a, "bos_token"_a = "",
                  "source"_a = "template", "eos_token"_a = "")
      .def("available", &edgellm::ChatTemplate::available)
      .def("renders_tools", &edgellm::ChatTemplate::renders_tools)
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
          "messages"_a, "add_generation_prompt"_a = true)
      .def(
          "render_conversation",
          [](const edgellm::ChatTemplate& t, std::string_view messages_json,
             bool add_generation_prompt, std::string_view tools_json,
             std::string_view kwargs_json) {
            const auto tools = edgellm::parse_ordered_json(tools_json, "tools");
            const auto kwargs = edgellm::parse_ordered_json(kwargs_json, "chat_template_kwargs");
            return with_tool_errors([&] {
              return edgellm::render_conversation(t, openai_messages(messages_json),
                                                  add_generation_prompt,
                                                  edgellm::parse_tools(tools, nullptr), kwargs);
            });
          },
          "messages_json"_a, "add_generation_prompt"_a = true, "tools_json"_a = "null",
          "kwargs_json"_a = "{}",
          "OpenAI-shaped messages (role, content, tool_calls, tool_call_id) as JSON text, "
          "rendered as the server renders them");

  nb::class_<edgellm::Session>(m, "Session")
      .def(nb::init<>())
      .def(
          "setup",
          [](edgellm::Session& s, const std::filesystem::path& dir, int threads, int max_context,
             bool profile, const std::string& weights, const std::string& kv_cache,
             const std::string& precision, const std::string& gemm_precision,
             const std::string& attn_precision, const std::string& quant_activations,
             const std::string& isa, bool use_environment) {
            const edgellm::SessionOptions o = session_options(
                threads, max_context, profile, weights, kv_cache, precision, gemm_precision,
                attn_precision, quant_activations, isa, use_environment);
            nb::gil_scoped_release release;
            s.setup(dir, o);
          },
          "model_dir"_a, "threads"_a = 0, "max_context"_a = edgellm::SessionOptions{}.max_context,
          "profile"_a = false, "weights"_a = "", "kv_cache"_a = "", "precision"_a = "",
          "gemm_precision"_a = "", "attn_precision"_a = "", "quant_activations"_a = "",
          "isa"_a = "", "use_environment"_a = false,
          "precision: fast (default) | exact; the other strings override its parts; "
          "use_environment fills empty ones from EDGELLM_*")
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
          "prefill_logits",
          [](edgellm::Session& s, const std::vector<int32_t>& tokens, int start_pos) {
            edgellm::PrefillCapture capture;
            capture.layers = false;
            capture.all_logits = true;
            {
              nb::gil_scoped_release release;
              s.prefill(tokens, start_pos, &capture);
            }
            const size_t vocab = static_cast<size_t>(s.config().vocab_size);
            return to_numpy(std::move(capture.logits), tokens.size(), vocab);
          },
          "tokens"_a, "start_pos"_a = 0,
          "logits [n, vocab] of every position, each row as a decode step computes it")
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
      .def_prop_ro(
          "context", [](edgellm::Session& s) -> edgellm::Context& { return s.context(); },
          nb::rv_policy::reference_internal, "the Session's one Context (for generate())")
      .def_prop_ro("tokenizer", &edgellm::Session::tokenizer, nb::rv_policy::reference_internal)
      .def_prop_ro("chat_template", &edgellm::Session::chat_template,
                   nb::rv_policy::reference_internal)
      .def_prop_ro("max_context", &edgellm::Session::max_context)
      .def_prop_ro("weight_bytes", &edgellm::Session::weight_bytes)
      .def_prop_ro("kv_cache_dtype", &edgellm::Session::kv_cache_dtype,
                   "the KV cache's element type, fp32, bf16 or q8_0 (the gate's precision tier "
                   "reads it)")
      .def_prop_ro("kv_cache_bytes", &edgellm::Session::kv_cache_bytes)
      .def_prop_ro(
          "exec_config",
          [](const edgellm::Session& s) { return exec_config_dict(s.exec_config()); },
          "the arithmetic resolved at setup: isa, gemm, attention, kv_cache, quant_activations, "
          "exact, description")
      .def_prop_ro("vocab_size", [](const edgellm::Session& s) { return s.config().vocab_size; })
      .def_prop_ro("num_layers", [](const edgellm::Session& s) { return s.config().num_layers; })
      .def_prop_ro("hidden_size", [](const edgellm::Session& s) { return s.config().hidden_size; })
      .def_prop_ro("eos_token_ids",
                   [](const edgellm::Session& s) { return s.config().eos_token_ids; })
      .def_prop_ro("rounded_weights", &edgellm::Session::rounded_weights,
                   "'F32' / 'F16': matrices rounded to bf16 at load; '': held exactly");

  // The model store and the engine's rules for model paths (edgellm/model_store.h).
  // The deployment descriptors belong to the applications, which bind them
  // themselves: the engine knows no deployment.
  m.attr("DEFAULT_MAX_CONTEXT") = edgellm::SessionOptions{}.max_context;
  m.def("model_store", &edgellm::model_store,
        "$EDGELLM_MODELS, else the front end's default, else ~/.cache/edgellm/models");
  m.def("set_default_model_store", &edgellm::set_default_model_store, "store"_a,
        "a front end's default store (empty: none); $EDGELLM_MODELS still wins");
  m.def("checkpoint_dir", &edgellm::checkpoint_dir, "model"_a,
        "the HF-format directory of a model path: itself, or the one holding a .gguf file");
  m.def("model_id", &edgellm::model_id, "model"_a,
        "the id a server gives a model path it was not told a name for");

  // What chat and the server feed the model: each message's content as plain text.
  m.def(
      "encode_conversation",
      [](const edgellm::Tokenizer& tokenizer, const edgellm::ChatTemplate& chat_template,
         const std::vector<std::pair<std::string, std::string>>& msgs, bool add_generation_prompt) {
        std::vector<edgellm::ChatMessage> messages;
        for (const auto& [role, content] : msgs) messages.push_back({role, content});
        return edgellm::encode_conversation(tokenizer, chat_template, messages,
                                            add_generation_prompt);
      },
      "tokenizer"_a, "chat_template"_a, "messages"_a, "add_generation_prompt"_a = true);
  // With tools (edgellm/tool_calls.h): messages are (role, content, [(id, name,
  // arguments)]) so an assistant turn can carry its calls.
  m.def(
      "encode_conversation",
      [](const edgellm::Tokenizer& tokenizer, const edgellm::ChatTemplate& chat_template,
         const std::vector<
             std::tuple<std::string, std::string,
                        std::vector<std::tuple<std::string, std::string, std::string>>>>& msgs,
         bool add_generation_prompt, const edgellm::Tools& tools) {
        std::vector<edgellm::ChatMessage> messages;
        for (const auto& [role, content, calls] : msgs) {
          edgellm::ChatMessage& msg = messages.emplace_back(edgellm::ChatMessage{role, content});
          for (const auto& [id, name, arguments] : calls)
            msg.tool_calls.push_back({id, name, arguments});
        }
        return edgellm::encode_conversation(tokenizer, chat_template, messages,
                                            add_generation_prompt, tools);
      },
      "tokenizer"_a, "chat_template"_a, "messages"_a, "add_generation_prompt"_a, "tools"_a);
  // The server's encoder: OpenAI messages as JSON text (role, content, tool_calls,
  // tool_call_id, name), the request's Tools and chat_template_kwargs (JSON text).
  m.def(
      "encode_chat",
      [](const edgellm::Tokenizer& tokenizer, const edgellm::ChatTemplate& chat_template,
         std::string_view messages_json, const edgellm::Tools& tools,
         std::string_view kwargs_json) {
        return with_tool_errors([&] {
          return edgellm::encode_conversation(
              tokenizer, chat_template, openai_messages(messages_json), true, tools,
              edgellm::parse_ordered_json(kwargs_json, "chat_template_kwargs"));
        });
      },
      "tokenizer"_a, "chat_template"_a, "messages_json"_a, "tools"_a, "kwargs_json"_a = "null");
  // ---- Model / Context / generate: the embedding API ------------------------
  nb::class_<edgellm::SamplerOptions>(m, "SamplerOptions")
      .def(nb::init<>())
      .def_rw("temperature", &edgellm::SamplerOptions::temperature, "0 = greedy")
      .def_rw("top_k", &edgellm::SamplerOptions::top_k, "0 = off")
      .def_rw("top_p", &edgellm::SamplerOptions::top_p, "1 = off")
      .def_rw("seed", &edgellm::SamplerOptions::seed)
      .def_rw("min_p", &edgellm::SamplerOptions::min_p, "0 = off")
      .def_rw("frequency_penalty", &edgellm::SamplerOptions::frequency_penalty, "0 = off")
      .def_rw("presence_penalty", &edgellm::SamplerOptions::presence_penalty, "0 = off");

  nb::class_<edgellm::Sampler>(m, "Sampler",
                               "Picks the next token from logits: greedy at temperature 0, "
                               "else penalties / temperature / top-k / top-p / min-p with a "
                               "seeded generator.")
      .def(
          "__init__",
          [](edgellm::Sampler* self, float temperature, int top_k, float top_p, uint64_t seed,
             float min_p, float frequency_penalty, float presence_penalty) {
            new (self) edgellm::Sampler(edgellm::SamplerOptions{
                temperature, top_k, top_p, seed, min_p, frequency_penalty, presence_penalty});
          },
          "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = 0, "min_p"_a = 0.0f,
          "frequency_penalty"_a = 0.0f, "presence_penalty"_a = 0.0f)
      .def(
          "sample",
          [](edgellm::Sampler& s, nb::ndarray<const float, nb::ndim<1>, nb::c_contig> logits) {
            return s.sample({logits.data(), logits.shape(0)});
          },
          "logits"_a, "The next token id for these logits ([vocab] float32).");

  nb::class_<edgellm::Model>(m, "Model",
                             "The immutable model (config, tokenizer, chat template, packed "
                             "weights), loaded once and shared by any number of Contexts.")
      .def(nb::init<>())
      .def(
          "setup",
          [](edgellm::Model& self, const std::filesystem::path& dir, int threads, int max_context,
             const std::string& kv_cache, const std::string& precision, const std::string& weights,
             bool use_environment) {
            const edgellm::SessionOptions o =
                session_options(threads, max_context, false, weights, kv_cache, precision, "", "",
                                "", "", use_environment);
            nb::gil_scoped_release release;
            self.setup(dir, o);
          },
          "model_dir"_a, "threads"_a = 0, "max_context"_a = 4096, "kv_cache"_a = "",
          "precision"_a = "", "weights"_a = "", "use_environment"_a = true,
          "Loads and validates a checkpoint directory, packs the weights, starts the threads. "
          "max_context is the KV cache size of each Context; kv_cache its element type (fp32, "
          "bf16 or q8_0); precision fast (default) or exact; weights q8_0|q4_0 quantizes a bf16 "
          "checkpoint at setup. Empty strings take EDGELLM_* defaults (use_environment).")
      .def_prop_ro("ready", &edgellm::Model::ready)
      .def_prop_ro("tokenizer", &edgellm::Model::tokenizer, nb::rv_policy::reference_internal)
      .def_prop_ro("chat_template", &edgellm::Model::chat_template,
                   nb::rv_policy::reference_internal)
      .def_prop_ro("max_context", &edgellm::Model::max_context)
      .def_prop_ro("kv_cache_dtype", &edgellm::Model::kv_cache_dtype)
      .def_prop_ro(
          "exec_config", [](const edgellm::Model& s) { return exec_config_dict(s.exec_config()); },
          "the arithmetic resolved at setup")
      .def_prop_ro("vocab_size", [](const edgellm::Model& s) { return s.config().vocab_size; })
      .def_prop_ro("eos_token_ids",
                   [](const edgellm::Model& s) { return s.config().eos_token_ids; })
      .def_prop_ro("rounded_weights", &edgellm::Model::rounded_weights,
                   "'F32' / 'F16': matrices rounded to bf16 at load; '': held exactly");

  nb::class_<edgellm::Context>(m, "Context",
                               "One sequence of a Model: its KV cache, scratch and position. "
                               "It keeps the model's weights alive.")
      .def(nb::init<>())
      .def(nb::init<const edgellm::Model&>(), "model"_a)
      .def_prop_ro("ready", &edgellm::Context::ready)
      .def_prop_ro("position", &edgellm::Context::position,
                   "The next position to run (tokens in the KV cache).")
      .def_prop_ro("max_context", &edgellm::Context::max_context)
      .def(
          "prefill",
          [](edgellm::Context& c, const std::vector<int32_t>& tokens, int start_pos) {
            std::span<const float> logits;
            {
              nb::gil_scoped_release release;
              logits = c.prefill(tokens, start_pos);
            }
            return to_numpy(logits);
          },
          "tokens"_a, "start_pos"_a = 0, "Runs tokens at [start_pos, ...); the last one's logits.")
      .def(
          "decode_step",
          [](edgellm::Context& c, int32_t token, int pos) {
            std::span<const float> logits;
            {
              nb::gil_scoped_release release;
              logits = c.decode_step(token, pos);
            }
            return to_numpy(logits);
          },
          "token"_a, "pos"_a, "Runs one token at pos; the next position's logits.");

  m.def(
      "embed",
      [](edgellm::Context& c, const std::vector<std::vector<int32_t>>& inputs,
         std::optional<int> dimensions) {
        nb::gil_scoped_release release;
        return edgellm::embed(c, inputs, dimensions);
      },
      "context"_a, "inputs"_a, "dimensions"_a = nb::none(),
      "Each token list's last-token hidden state after the final norm, L2-normalised "
      "(truncated to `dimensions` first, then normalised).");
  m.def(
      "last_token_logits",
      [](edgellm::Context& c, const std::vector<std::vector<int32_t>>& inputs,
         const std::vector<int32_t>& tokens) {
        nb::gil_scoped_release release;
        return edgellm::last_token_logits(c, inputs, tokens);
      },
      "context"_a, "inputs"_a, "tokens"_a,
      "Each token list's logits at its last position, of `tokens` only.");
  m.def("rerank_prompt", &edgellm::rerank_prompt, "tokenizer"_a, "query"_a, "document"_a,
        "instruction"_a = edgellm::kDefaultRerankInstruction,
        "Qwen3-Reranker's prompt tokens for one (query, document) pair.");
  m.def(
      "rerank_scores",
      [](edgellm::Context& c, const std::string& query, const std::vector<std::string>& documents,
         const std::string& instruction) {
        nb::gil_scoped_release release;
        return edgellm::rerank_scores(c, query, documents, instruction);
      },
      "context"_a, "query"_a, "documents"_a,
      "instruction"_a = std::string(edgellm::kDefaultRerankInstruction),
      "p(yes) of each document's Qwen3-Reranker pair prompt, in the documents' order.");
  m.def(
      "rerank",
      [](edgellm::Context& c, const std::string& query, const std::vector<std::string>& documents,
         std::optional<int64_t> top_n) {
        edgellm::Ranking r;
        {
          nb::gil_scoped_release release;
          r = edgellm::rerank(c, query, documents, top_n);
        }
        nb::list results;
        for (const edgellm::RankedDocument& d : r.results) {
          nb::dict item;
          item["index"] = d.index;
          item["relevance_score"] = d.relevance_score;
          results.append(item);
        }
        return std::make_pair(results, r.prompt_tokens);
      },
      "context"_a, "query"_a, "documents"_a, "top_n"_a = nb::none(),
      "([{index, relevance_score}] highest first, the first top_n; prompt tokens).");
  m.def(
      "decode_batch",
      [](const std::vector<edgellm::Context*>& contexts, const std::vector<int32_t>& tokens,
         const std::vector<int>& positions) {
        {
          nb::gil_scoped_release release;
          edgellm::decode_batch(contexts, tokens, positions);
        }
        nb::list out;
        for (const edgellm::Context* c : contexts) out.append(to_numpy(c->logits()));
        return out;
      },
      "contexts"_a, "tokens"_a, "positions"_a,
      "One decode step for several contexts of one model in one pass over the weights; returns "
      "each context's next-token logits, identical to its own decode_step.");

  nb::class_<TextStream>(m, "TextStream",
                         "Iterator over the text of a generation (see generate()).")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &TextStream::next)
      .def_prop_ro("done", [](const TextStream& s) { return s.generation().done(); })
      .def_prop_ro(
          "finish_reason",
          [](const TextStream& s) {
            return std::string(edgellm::finish_reason_name(s.generation().finish_reason()));
          })
      .def_prop_ro("tokens", [](const TextStream& s) { return s.generation().tokens(); })
      .def_prop_ro("text", [](const TextStream& s) { return s.generation().text(); })
      .def_prop_ro("position", &TextStream::position);

  m.def(
      "generate",
      [](edgellm::Context& context, std::vector<int32_t> prompt, int max_tokens, float temperature,
         int top_k, float top_p, uint64_t seed, std::vector<std::string> stop,
         std::vector<int32_t> stop_tokens, bool stop_at_eos, int start_pos, float min_p,
         float frequency_penalty, float presence_penalty, bool lookup, const PyGrammar* grammar,
         std::optional<PyReasoning> reasoning) {
        edgellm::GenerateOptions o =
            generate_options(max_tokens, temperature, top_k, top_p, seed, std::move(stop),
                             std::move(stop_tokens), stop_at_eos);
        o.sampling.min_p = min_p;
        o.sampling.frequency_penalty = frequency_penalty;
        o.sampling.presence_penalty = presence_penalty;
        o.lookup = lookup;
        if (grammar) o.grammar = grammar->grammar;
        o.reasoning = reasoning_of(reasoning);
        return TextStream(context, std::move(prompt), o, start_pos);
      },
      "context"_a, "prompt"_a, "max_tokens"_a = 100, "temperature"_a = 0.0f, "top_k"_a = 0,
      "top_p"_a = 1.0f, "seed"_a = 0, "stop"_a = std::vector<std::string>{},
      "stop_tokens"_a = std::vector<int32_t>{}, "stop_at_eos"_a = true, "start_pos"_a = 0,
      "min_p"_a = 0.0f, "frequency_penalty"_a = 0.0f, "presence_penalty"_a = 0.0f,
      "lookup"_a = true, "grammar"_a = nb::none(), "reasoning"_a = nb::none(),
      nb::keep_alive<0, 1>(),
      "Streams the text generated after `prompt` (token ids) in `context`: prefill, then one "
      "decode step per iteration, until EOS / a stop token or string / max_tokens / the end of "
      "the context. The iterator's finish_reason, tokens and text tell the outcome. grammar "
      "(compile_json_schema / compile_response_format): structured output. reasoning: "
      "chat_reasoning()'s (enabled, started, budget, harmony).");

  nb::class_<GenerateRun>(m, "GenerateResult", "What generate_timed() produced and measured.")
      .def_prop_ro(
          "tokens", [](const GenerateRun& r) { return r.result.tokens; },
          "generated ids, the stop token excluded")
      .def_prop_ro("text", [](const GenerateRun& r) { return r.result.text; })
      .def_prop_ro("finish_reason",
                   [](const GenerateRun& r) {
                     return std::string(edgellm::finish_reason_name(r.result.finish));
                   })
      .def_prop_ro("prompt_tokens", [](const GenerateRun& r) { return r.result.prompt_tokens; })
      .def_prop_ro(
          "ttft_ms", [](const GenerateRun& r) { return r.result.ttft_ms; },
          "prefill and the first token's sampling")
      .def_prop_ro("decode_ms", [](const GenerateRun& r) { return r.result.decode_ms; })
      .def_prop_ro("decode_steps", [](const GenerateRun& r) { return r.result.decode_steps; })
      .def_prop_ro(
          "end_pos", [](const GenerateRun& r) { return r.result.end_pos; },
          "positions [0, end_pos) are in the context's cache")
      .def_prop_ro(
          "sampled", [](const GenerateRun& r) { return r.sampled; },
          "every sampled id in order: output, the stop token, unseen ones")
      .def_prop_ro(
          "logits",
          [](const GenerateRun& r) -> nb::object {
            if (r.vocab == 0) return nb::none();
            std::vector<float> copy = r.logits;
            return nb::cast(to_numpy(std::move(copy), r.sampled.size(), r.vocab));
          },
          "[len(sampled), vocab] float32: the logits each sampled id came from (record_logits)")
      .def_prop_ro(
          "layer_outputs",
          [](const GenerateRun& r) -> nb::object {
            if (!r.captured) return nb::none();
            const size_t hidden = r.capture.final_hidden.size() / r.result.prompt_tokens;
            nb::list layers;
            for (std::vector<float> l : r.capture.layer_outputs)
              layers.append(to_numpy(std::move(l), r.result.prompt_tokens, hidden));
            return layers;
          },
          "the prefill's residual stream after each layer, [prompt, hidden] (capture)")
      .def_prop_ro(
          "final_hidden",
          [](const GenerateRun& r) -> nb::object {
            if (!r.captured) return nb::none();
            const size_t rows = r.result.prompt_tokens, cols = r.capture.final_hidden.size() / rows;
            std::vector<float> copy = r.capture.final_hidden;
            return nb::cast(to_numpy(std::move(copy), rows, cols));
          },
          "the prefill's hidden states after the final norm, [prompt, hidden] (capture)");

  m.def(
      "generate_timed",
      [](edgellm::Context& context, std::vector<int32_t> prompt, int max_tokens, float temperature,
         int top_k, float top_p, uint64_t seed, std::vector<std::string> stop,
         std::vector<int32_t> stop_tokens, bool stop_at_eos, int start_pos, bool decode_past_stop,
         bool record_logits, bool capture, bool lookup, const PyGrammar* grammar) {
        edgellm::GenerateOptions o =
            generate_options(max_tokens, temperature, top_k, top_p, seed, std::move(stop),
                             std::move(stop_tokens), stop_at_eos);
        o.decode_past_stop = decode_past_stop;
        o.lookup = lookup;
        if (grammar) o.grammar = grammar->grammar;
        GenerateRun run;
        GenerateRun* r = &run;  // the hook fills it; `run` outlives the generate() call
        if (record_logits) r->vocab = static_cast<size_t>(context.config().vocab_size);
        o.on_sample = [r](std::span<const float> logits, int32_t token) {
          r->sampled.push_back(token);
          if (r->vocab) r->logits.insert(r->logits.end(), logits.begin(), logits.end());
        };
        if (capture) {
          r->captured = true;
          o.capture = &r->capture;
        }
        {
          nb::gil_scoped_release release;
          r->result = edgellm::generate(context, prompt, o, {}, start_pos);
        }
        return run;
      },
      "context"_a, "prompt"_a, "max_tokens"_a = 100, "temperature"_a = 0.0f, "top_k"_a = 0,
      "top_p"_a = 1.0f, "seed"_a = 0, "stop"_a = std::vector<std::string>{},
      "stop_tokens"_a = std::vector<int32_t>{}, "stop_at_eos"_a = true, "start_pos"_a = 0,
      "decode_past_stop"_a = false, "record_logits"_a = false, "capture"_a = false,
      "lookup"_a = true, "grammar"_a = nb::none(),
      "Runs generate() to the end with the GIL released: the programs' loop and timing "
      "(ttft_ms = prefill + first token, decode_ms over decode_steps). decode_past_stop keeps "
      "decoding, unseen, after a stop until max_tokens were sampled (--ignore-eos); "
      "record_logits keeps every sampled token's logits; capture the prefill's layer outputs.");
  bind_serving(m);  // the server's continuous-batching Scheduler
}
