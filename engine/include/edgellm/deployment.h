// A deployment's descriptor (llms/<name>/deployment.json) and the policy every
// front end shares: where checkpoints live, what --model means, and whether a
// prompt goes through the chat template. make, the inference programs and the
// verify adapters (through the binding) all read the same file and these rules.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "edgellm/tokenizer.h"

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

  // Reads and validates a descriptor; errors name the file and the field.
  static Deployment load(const std::filesystem::path& file);
  // llms/<name>/deployment.json of the source tree this binary was built from.
  static Deployment load_named(const std::string& name);

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

// The model store: $EDGELLM_MODELS, else <repo>/models.
std::filesystem::path model_store();

// The HF-format directory of a model path: itself, or the one holding a .gguf
// file (the converter writes the dequantized checkpoint beside the GGUF).
std::filesystem::path checkpoint_dir(const std::filesystem::path& model);
// A .gguf file with no converted checkpoint (config.json) beside it: it runs
// from its own metadata (config, tokenizer, chat template).
bool is_bare_gguf(const std::filesystem::path& model);
// The model's chat template: the checkpoint's, or a bare GGUF's own.
ChatTemplate chat_template_of(const std::filesystem::path& model);

// The id a server gives a model path that was not named (clients send it as
// "model"): a directory's name; a .gguf file's stem, or for the generic
// "model.gguf" its checkpoint's name + "-gguf", skipping a folder called "gguf"
// (models/smollm2-135m-instruct/gguf/model.gguf -> smollm2-135m-instruct-gguf).
std::string model_id(const std::filesystem::path& model);

}  // namespace edgellm
