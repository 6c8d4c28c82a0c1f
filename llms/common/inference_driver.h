// The shared inference program behind every deployment (llms/<name>/deployment.json).
// Its main flow is the seed's clean structure:
//
//   setup()                        one-time: load, pre-pack, allocate (untimed)
//   ---- timed region ----
//   prefill(prompt tokens)         TTFT
//   decode loop                    TPS
//   ----------------------
//
// No warm-up runs, cache primes or timing resets happen inside the timed region.
// The answer alone goes to stdout; figures and notes go to stderr (or, with
// --json, one JSON object to stdout).
#pragma once

#include <string>

namespace edgellm {

// Parses the command line and runs: one-shot generation, --profile, or --chat.
int run_inference_main(const std::string& deployment_name, int argc, char** argv);

}  // namespace edgellm
