// The model store and the rules for model paths (edgellm/model_store.h).
#include "edgellm/model_store.h"

#include <cstdlib>

#include "edgellm/error.h"

namespace edgellm {

namespace {

std::filesystem::path& default_store() {
  static std::filesystem::path store;  // rule 2: set by the front end, empty when unset
  return store;
}

}  // namespace

std::filesystem::path model_store() {
  if (const char* env = std::getenv("EDGELLM_MODELS"); env && *env) return env;
  if (!default_store().empty()) return default_store();
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "edgellm" / "models";
  const char* home = std::getenv("HOME");
  check(home && *home,
        "no model store: set EDGELLM_MODELS (neither XDG_CACHE_HOME nor HOME is set)");
  return std::filesystem::path(home) / ".cache" / "edgellm" / "models";
}

void set_default_model_store(const std::filesystem::path& store) {
  default_store() = store;
}

std::filesystem::path checkpoint_dir(const std::filesystem::path& model) {
  if (model.extension() != ".gguf") return model;
  // A bare file name ("model.gguf") has an empty parent: the current folder holds it.
  return model.has_parent_path() ? model.parent_path() : std::filesystem::path(".");
}

std::string model_id(const std::filesystem::path& model) {
  std::filesystem::path path = std::filesystem::weakly_canonical(std::filesystem::absolute(model));
  if (path.filename().empty()) path = path.parent_path();  // "dir/"
  if (path.extension() != ".gguf") return path.filename().string();
  if (path.stem() != "model") return path.stem().string();
  std::filesystem::path dir = path.parent_path();
  if (dir.filename() == "gguf") dir = dir.parent_path();
  return dir.filename().string() + "-gguf";
}

bool is_bare_gguf(const std::filesystem::path& model) {
  return model.extension() == ".gguf" &&
         !std::filesystem::exists(checkpoint_dir(model) / "config.json");
}

ChatTemplate chat_template_of(const std::filesystem::path& model) {
  return is_bare_gguf(model) ? ChatTemplate::from_gguf(model)
                             : ChatTemplate::load(checkpoint_dir(model));
}

}  // namespace edgellm
