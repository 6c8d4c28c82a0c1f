// `edgellm verify`: the gate against HF transformers (llms/verify/verify_runner.py)
// for a deployment's model, run by the project's Python venv. A thin exec: the
// verify subsystem stays Python; this only builds its command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deployment.h"

namespace CLI {
class App;
}

namespace edgellm {

struct VerifyOptions {
  std::string model;
  std::string weights;
  int threads = 0;
  bool full = false;                     // every prompt, not the first two
  std::optional<int> max_prompts;        // overrides the two of the quick gate
  std::vector<std::string> runner_args;  // after --: passed to verify_runner.py as they are
};

void add_verify_options(CLI::App& cmd, VerifyOptions& opt, const Deployment& deployment);

// Replaces this process with verify_runner.py; returns only on failure (thrown as Error).
int run_verify(const Deployment& deployment, const VerifyOptions& opt);

}  // namespace edgellm
