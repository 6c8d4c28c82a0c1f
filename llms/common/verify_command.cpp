#include "verify_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "edgellm/error.h"

namespace edgellm {

namespace {

namespace fs = std::filesystem;

// The venv `make bootstrap` links at <repo>/.venv; EDGELLM_VENV names another.
fs::path venv_python() {
  const char* env = std::getenv("EDGELLM_VENV");
  const fs::path venv = env && *env ? fs::path(env) : fs::path(EDGELLM_SOURCE_DIR) / ".venv";
  const fs::path python = venv / "bin" / "python";
  check(access(python.c_str(), X_OK) == 0,
        "edgellm verify runs llms/verify/verify_runner.py in the Python venv, and there is none "
        "at " +
            venv.string() + " (run `make bootstrap`, or set EDGELLM_VENV)");
  return python;
}

// What the make targets export: the engine binding, llms/ (the adapters) and the repo
// on the import path, after the caller's own; no model hub.
void set_verify_environment() {
  std::string path;
  if (const char* own = std::getenv("PYTHONPATH"); own && *own) path = std::string(own) + ":";
  path += std::string(EDGELLM_BUILD_DIR) + "/python:" + EDGELLM_SOURCE_DIR +
          "/llms:" + EDGELLM_SOURCE_DIR;
  setenv("PYTHONPATH", path.c_str(), 1);
  setenv("HF_HUB_OFFLINE", "1", 0);
  setenv("TRANSFORMERS_OFFLINE", "1", 0);
}

}  // namespace

void add_verify_options(CLI::App& cmd, VerifyOptions& opt, const Deployment& deployment) {
  opt.model = deployment.default_model;
  cmd.add_option("-m,--model", opt.model, "a choice of the deployment or a checkpoint directory")
      ->capture_default_str();
  cmd.add_option("--weights", opt.weights, "quantize the checkpoint's matrices at setup")
      ->check(CLI::IsMember({"q8_0", "q4_0"}));
  cmd.add_option("-t,--threads", opt.threads, "engine threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* full = cmd.add_flag("--full", opt.full, "gate every prompt (default: the first 2)");
  cmd.add_option("--max-prompts", opt.max_prompts, "gate the first N prompts")
      ->check(CLI::PositiveNumber)
      ->excludes(full);
  cmd.add_option("runner_args", opt.runner_args,
                 "after --: more flags for verify_runner.py (e.g. -- --spec-gate)");
}

int run_verify(const Deployment& deployment, const VerifyOptions& opt) {
  const fs::path python = venv_python();
  const fs::path runner = fs::path(EDGELLM_SOURCE_DIR) / "llms" / "verify" / "verify_runner.py";
  std::vector<std::string> args = {
      python.string(), runner.string(), "--runner=" + deployment.name + ".verify_adapter",
      "--prompts",     "topk_token",    "--model",
      opt.model,       "--threads",     std::to_string(opt.threads)};
  if (!opt.full)
    args.insert(args.end(), {"--max-prompts", std::to_string(opt.max_prompts.value_or(2))});
  if (!opt.weights.empty()) args.insert(args.end(), {"--weights", opt.weights});
  args.insert(args.end(), opt.runner_args.begin(), opt.runner_args.end());
  set_verify_environment();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  throw Error("edgellm verify: cannot start " + python.string() + ": " + std::strerror(errno));
}

}  // namespace edgellm
