// The model store and the engine's rules for model paths: where named
// checkpoints live, the HF-format directory of a .gguf file, a bare GGUF, the
// chat template of either, and the id a server gives a path.
//
// Where the store is, first match wins:
//   1. $EDGELLM_MODELS (the user's choice, read at every call);
//   2. the front end's default, set once at start-up with
//      set_default_model_store() (the edgellm command and the verify adapters,
//      built from a source tree, pass its models/ folder, which `make fetch` fills);
//   3. ${XDG_CACHE_HOME:-$HOME/.cache}/edgellm/models, the per-user cache
//      (scripts/bootstrap.sh links a clone's models/ to it when models/ is absent,
//      so 2 and 3 are usually one directory).
// The library bakes in no path of the tree it was built from: an installed
// libedgellm or wheel finds the same store a clone's front ends fill.
#pragma once

#include <filesystem>
#include <string>

#include "edgellm/tokenizer.h"

namespace edgellm {

// The store, by the rule above. Throws Error only when none of the three is
// set (no EDGELLM_MODELS, no default, no XDG_CACHE_HOME and no HOME).
std::filesystem::path model_store();

// A front end's default store (rule 2); an empty path clears it. Call it before
// threads that read model_store() start.
void set_default_model_store(const std::filesystem::path& store);

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
