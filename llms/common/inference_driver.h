// The shared inference program behind every deployment's <model>_inference.cpp.
// Its main flow is the seed's clean structure:
//
//   setup()                        one-time: load, pre-pack, allocate (untimed)
//   ---- timed region ----
//   prefill(prompt tokens)         TTFT
//   decode loop                    TPS
//   ----------------------
//
// No warm-up runs, cache primes or timing resets happen inside the timed region.
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace edgellm {

// What a deployment decides; everything else is shared.
struct Deployment {
  std::string name;  // folder name under llms/, e.g. "smollm2_135m"
  // --model choices: key -> checkpoint directory name in the model store.
  std::map<std::string, std::string> models;
  std::string default_model;  // key of `models`
  std::string default_prompt;
};

// The model store: $EDGELLM_MODELS, else <repo>/models.
std::filesystem::path model_store();

// A --model value: a key of deployment.models (looked up in the store) or a path.
std::filesystem::path resolve_model(const Deployment& deployment, const std::string& choice);

// Parses the command line and runs: one-shot generation, --profile, or --chat.
int run_inference_main(const Deployment& deployment, int argc, char** argv);

}  // namespace edgellm
