// edgellm: the one command.
//   edgellm run|chat|bench|serve|verify [--deployment NAME] [flags]
// A deployment (llms/<name>/deployment.json) is a preset: its --model choices,
// default model, prompt and context. It comes from --deployment, else
// $EDGELLM_DEPLOYMENT, else the project's default; a --model path runs under any.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "deployment.h"
#include "edgellm/error.h"
#include "inference_driver.h"
#include "serve_command.h"
#include "verify_command.h"

namespace edgellm {
namespace {

constexpr const char* kSubcommands = "run, chat, bench, serve or verify";

// The preset's name, read by a first, lenient pass so that the real parse (and
// --help) starts from its defaults. Errors are left to the real parse.
std::string deployment_name(int argc, char** argv) {
  const char* env = std::getenv("EDGELLM_DEPLOYMENT");
  std::string name = env && *env ? env : EDGELLM_DEFAULT_DEPLOYMENT;
  CLI::App first_pass;
  first_pass.set_help_flag();
  first_pass.allow_extras();
  first_pass.add_option("--deployment", name);
  try {
    first_pass.parse(argc, argv);
  } catch (const CLI::ParseError&) {
  }
  return name;
}

Deployment load_deployment(const std::string& name) {
  const std::filesystem::path file = llms_dir() / name / "deployment.json";
  if (!std::filesystem::is_regular_file(file)) {
    std::string known;
    for (const std::string& entry : Deployment::names())
      known += (known.empty() ? "" : ", ") + entry;
    throw Error("--deployment " + name + ": no " + file.string() + " (known: " + known + ")");
  }
  return Deployment::load_named(name);
}

// Every subcommand takes --deployment; its value was read by deployment_name().
void add_deployment_option(CLI::App& cmd, std::string& name) {
  cmd.add_option("--deployment", name,
                 "preset llms/<NAME>/deployment.json: --model choices and defaults "
                 "(default: $EDGELLM_DEPLOYMENT, else " EDGELLM_DEFAULT_DEPLOYMENT ")")
      ->capture_default_str();
}

int cli_main(int argc, char** argv) {
  use_source_model_store();  // <repo>/models, unless $EDGELLM_MODELS says otherwise
  std::string name = deployment_name(argc, argv);
  // A preset that cannot be read is reported only when a subcommand runs, so that
  // --version and --help still answer.
  std::optional<Deployment> deployment;
  std::optional<Error> deployment_error;
  try {
    deployment = load_deployment(name);
  } catch (const Error& e) {
    deployment_error = e;
    deployment.emplace();
    deployment->name = name;
  }

  CLI::App app{"edgellm: LLM inference on the CPU, HF checkpoints and GGUF files", "edgellm"};
  app.set_version_flag("--version", "edgellm " EDGELLM_VERSION);
  app.require_subcommand(1);
  InferenceOptions inference;
  CLI::App* run = app.add_subcommand("run", "answer one prompt, then print TTFT and TPS");
  CLI::App* chat = app.add_subcommand("chat", "interactive chat (/help inside; Ctrl-D quits)");
  CLI::App* bench =
      app.add_subcommand("bench", "timed prefill + decode over all --n-tokens; figures only");
  CLI::App* serve = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  CLI::App* verify = app.add_subcommand(
      "verify", "the gate against HF transformers (llms/verify/verify_runner.py, in the venv)");
  for (CLI::App* cmd : {run, chat, bench, serve, verify}) add_deployment_option(*cmd, name);
  app.footer("`edgellm SUBCOMMAND --help` lists a subcommand's flags.");  // after: not inherited
  add_inference_options(*run, inference, *deployment, InferenceMode::run);
  add_inference_options(*chat, inference, *deployment, InferenceMode::chat);
  add_inference_options(*bench, inference, *deployment, InferenceMode::bench);
  ServeOptions serve_options;
  add_serve_options(*serve, serve_options, *deployment);
  VerifyOptions verify_options;
  add_verify_options(*verify, verify_options, *deployment);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-')
      std::fprintf(stderr, "error: unknown subcommand '%s' (expected %s; see --help)\n", argv[1],
                   kSubcommands);
    else if (app.get_subcommands().empty())
      std::fprintf(stderr, "error: a subcommand is needed: %s (see --help)\n", kSubcommands);
    else
      std::fprintf(stderr, "error: %s (see edgellm %s --help)\n", e.what(),
                   app.get_subcommands().front()->get_name().c_str());
    return 2;
  }
  if (deployment_error) throw *deployment_error;
  if (run->parsed()) return run_inference(*deployment, inference, InferenceMode::run);
  if (chat->parsed()) return run_inference(*deployment, inference, InferenceMode::chat);
  if (bench->parsed()) return run_inference(*deployment, inference, InferenceMode::bench);
  if (serve->parsed()) return run_serve(*deployment, serve_options);
  return run_verify(*deployment, verify_options);
}

}  // namespace
}  // namespace edgellm

int main(int argc, char** argv) {
  try {
    return edgellm::cli_main(argc, argv);
  } catch (const edgellm::Error& e) {
    // Every error an input can cause (a flag, a model file, its template, a schema): exit 2,
    // as for a bad flag. 1 is left to a failed gate and to bugs.
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}
