// The model configuration of a bare .gguf file, from its own metadata: the
// ModelConfig that load_model_config gives for the config.json
// scripts/fetch_model.py converts from the same file, so a GGUF runs with
// nothing beside it. llama.cpp's conventions (which keys exist, what it
// hard-codes per architecture) are followed where the metadata is silent.
#pragma once

#include <string>
#include <vector>

#include "edgellm/config.h"
#include "io/gguf.h"

namespace edgellm {

// general.architecture values this engine runs.
const std::vector<std::string>& supported_gguf_architectures();

// Throws Error naming the file and key for a missing or bad value, and naming
// the architecture (with the supported list) when it is not one we run.
ModelConfig model_config_from_gguf(const GgufFile& gguf);

}  // namespace edgellm
