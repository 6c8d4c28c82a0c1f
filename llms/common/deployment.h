// A deployment's descriptor (llms/<name>/deployment.json) and the policy every
// front end shares: what --model means, and whether a prompt goes through the
// chat template. make, the edgellm command and the verify adapters (through the
// edgellm_deployment module, llms/common/python) all read the same file and
// these rules. Application policy: the engine (edgellm/model_store.h) knows
// where checkpoints live, not which deployments exist.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "edgellm/model_store.h"

namespace edgellm {

enum class PromptFormat { chat, raw };

struct Deployment {
  std::string name;  // folder name under llms/, e.g. "smollm2_135m"
  // --model choices: key -> checkpoint directory name in the model store.
  std::map<std::string, std::string> models;
  std::string default_model;  // a key of `models`
  std::string default_prompt;
  // "auto": the chat template for instruct checkpoints, raw text for base ones;
  // "chat" or "raw" force one.
  std::string prompt_format = "auto";
  int max_context = 0;  // KV cache positions; 0 in the file: SessionOptions' default
  // The MLP activation of its checkpoints ("silu" or "gelu_tanh", as the engine's
  // config reads hidden_act): the kernel registry's "Used by" column comes from it.
  std::string hidden_act;

  // Reads and validates a descriptor; errors name the file and the field.
  static Deployment load(const std::filesystem::path& file);
  // llms/<name>/deployment.json of the source tree this binary was built from.
  static Deployment load_named(const std::string& name);
  // The deployments of that tree: the folders of llms_dir() holding a deployment.json.
  static std::vector<std::string> names();

  // A --model value: a key of `models` (looked up in the store), a checkpoint
  // directory or a .gguf file inside one. Throws one line when the checkpoint
  // directory holds no config.json.
  std::filesystem::path resolve_model(const std::string& choice) const;

  // "instruct" or "base": the converter's edgellm.json, else the --model key,
  // else whether the checkpoint ships a chat template.
  static std::string variant(const std::filesystem::path& model_dir, const std::string& choice);

  // How prompts reach this checkpoint (raw = true forces raw text).
  PromptFormat prompt_format_for(const std::filesystem::path& model_dir, const std::string& choice,
                                 bool raw = false) const;
};

// The source tree this front end was built from: its llms/ (the deployments)
// and its models/ folder, the store `make fetch` fills (scripts/bootstrap.sh
// links it to the engine's per-user cache when it is absent).
std::filesystem::path llms_dir();
std::filesystem::path source_model_store();
// What every front end built from the tree does at start-up:
// set_default_model_store(source_model_store()). $EDGELLM_MODELS still wins.
void use_source_model_store();

}  // namespace edgellm
