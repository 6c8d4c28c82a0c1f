// llms/<name>/deployment.json and the shared --model / prompt policy.
#include "deployment.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"
#include "edgellm/json_file.h"
#include "edgellm/session.h"

namespace edgellm {

namespace {

using nlohmann::json;

// deployment.json and the converter's edgellm.json: the engine's bounded reader.
json read_json_object(const std::filesystem::path& path) {
  json j = read_json_file(path);
  check(j.is_object(), path.string() + ": not a JSON object");
  return j;
}

std::string string_field(const json& j, const char* key, const std::string& file, bool required) {
  if (!j.contains(key)) {
    check(!required, file + ": field '" + key + "' is missing");
    return "";
  }
  check(j[key].is_string(), file + ": field '" + key + "' must be a string");
  return j[key].get<std::string>();
}

}  // namespace

std::filesystem::path llms_dir() {
  return EDGELLM_LLMS_DIR;
}

std::filesystem::path source_model_store() {
  return EDGELLM_SOURCE_MODELS;
}

void use_source_model_store() {
  set_default_model_store(source_model_store());
}

namespace {

// A store entry: a directory name, or a .gguf file inside one or inside its
// subdirectory (fetch_model.py's <dir>/gguf/model.gguf). Never a path that
// climbs out of the store.
bool is_store_entry(const std::string& entry) {
  const std::filesystem::path p(entry);
  if (entry.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "." || part == ".." || part.empty()) return false;
  const auto parts = std::distance(p.begin(), p.end());
  return parts == 1 || (parts <= 3 && p.extension() == ".gguf");
}

}  // namespace

Deployment Deployment::load(const std::filesystem::path& file) {
  const json j = read_json_object(file);
  const std::string f = file.string();
  static const char* const kKeys[] = {"name",          "models",         "fetch",
                                      "default_model", "default_prompt", "prompt_format",
                                      "max_context",   "hidden_act"};
  for (const auto& [key, value] : j.items())
    check(std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys),
          f + ": unknown field '" + key + "'");
  Deployment d;
  d.name = string_field(j, "name", f, true);
  check(j.contains("models") && j["models"].is_object() && !j["models"].empty(),
        f + ": field 'models' must be a non-empty object of --model key -> store directory");
  for (const auto& [key, dir] : j["models"].items()) {
    check(dir.is_string() && is_store_entry(dir.get<std::string>()),
          f + ": models." + key +
              " must be a directory name in the model store, or "
              "<directory>[/<subdirectory>]/<file>.gguf");
    d.models[key] = dir.get<std::string>();
  }
  // "fetch" (read by make) lists the store directories `make fetch` can bring.
  if (j.contains("fetch")) {
    check(j["fetch"].is_array(), f + ": field 'fetch' must be a list of store directories");
    for (const json& dir : j["fetch"]) {
      bool known = false;
      for (const auto& entry : d.models) known = known || (dir.is_string() && dir == entry.second);
      check(known, f + ": fetch entry " + dir.dump() + " is not a directory named in models");
    }
  }
  d.default_model = string_field(j, "default_model", f, true);
  check(d.models.contains(d.default_model),
        f + ": default_model '" + d.default_model + "' is not a key of models");
  d.default_prompt = string_field(j, "default_prompt", f, true);
  check(!d.default_prompt.empty(), f + ": default_prompt must not be empty");
  if (j.contains("prompt_format")) d.prompt_format = string_field(j, "prompt_format", f, true);
  check(d.prompt_format == "auto" || d.prompt_format == "chat" || d.prompt_format == "raw",
        f + ": prompt_format must be auto, chat or raw, got '" + d.prompt_format + "'");
  d.hidden_act = string_field(j, "hidden_act", f, true);
  check(d.hidden_act == "silu" || d.hidden_act == "gelu_tanh",
        f + ": hidden_act must be silu or gelu_tanh (the checkpoints' MLP activation), got '" +
            d.hidden_act + "'");
  d.max_context = SessionOptions{}.max_context;
  if (j.contains("max_context")) {
    const json& m = j["max_context"];
    check(m.is_number_integer() && m.get<long long>() >= 1 && m.get<long long>() <= 1 << 24,
          f + ": max_context must be an integer in [1, 16777216]");
    d.max_context = m.get<int>();
  }
  return d;
}

Deployment Deployment::load_named(const std::string& name) {
  return load(llms_dir() / name / "deployment.json");
}

std::vector<std::string> Deployment::names() {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(llms_dir()))
    if (std::filesystem::is_regular_file(entry.path() / "deployment.json"))
      found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}

namespace {

// A checkpoint directory, or a .gguf file inside one (run quantized).
bool is_model(const std::filesystem::path& p) {
  return std::filesystem::is_directory(p) ||
         (p.extension() == ".gguf" && std::filesystem::is_regular_file(p));
}

}  // namespace

std::filesystem::path Deployment::resolve_model(const std::string& choice) const {
  std::filesystem::path dir;
  if (auto it = models.find(choice); it != models.end()) {
    dir = model_store() / it->second;
    check(
        is_model(dir),
        "--model " + choice + ": checkpoint not found at " + dir.string() +
            " (no model hub is reachable offline: run the " + name +
            " deployment's `make fetch`, set EDGELLM_MODELS to a store holding it, or pass --model "
            "/path/to/checkpoint)");
  } else {
    dir = choice;
    if (!is_model(dir)) {
      std::string known;
      for (const auto& entry : models) known += (known.empty() ? "" : ", ") + entry.first;
      throw Error("--model " + choice + ": neither a known choice (" + known +
                  ") nor a checkpoint directory or .gguf file");
    }
  }
  check(dir.extension() == ".gguf" ||
            std::filesystem::is_regular_file(checkpoint_dir(dir) / "config.json"),
        "--model " + choice + ": " + checkpoint_dir(dir).string() +
            " is not a HF-format checkpoint (no config.json)");
  return dir;
}

std::string Deployment::variant(const std::filesystem::path& model, const std::string& choice) {
  const std::filesystem::path model_dir = checkpoint_dir(model);
  if (const auto meta = model_dir / "edgellm.json"; std::filesystem::is_regular_file(meta)) {
    const json j = read_json_object(meta);
    if (j.contains("edgellm_variant") && j["edgellm_variant"].is_string()) {
      const std::string v = j["edgellm_variant"].get<std::string>();
      if (v == "instruct" || v == "base") return v;
    }
  }
  if (choice == "instruct" || choice == "base") return choice;
  return chat_template_of(model).available() ? "instruct" : "base";
}

PromptFormat Deployment::prompt_format_for(const std::filesystem::path& model,
                                           const std::string& choice, bool raw) const {
  const std::filesystem::path model_dir = checkpoint_dir(model);
  if (raw || prompt_format == "raw") return PromptFormat::raw;
  if (prompt_format == "auto" && variant(model, choice) == "base") return PromptFormat::raw;
  check(chat_template_of(model).available(),
        model_dir.string() + ": an instruct checkpoint without a chat template (pass --raw)");
  return PromptFormat::chat;
}

}  // namespace edgellm
