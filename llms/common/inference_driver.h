// `edgellm run`, `chat` and `bench`: one model, one session. The flow is the
// seed's clean structure:
//
//   setup()                        one-time: load, pre-pack, allocate (untimed)
//   ---- timed region ----
//   prefill(prompt tokens)         TTFT
//   decode loop                    TPS
//   ----------------------
//
// No warm-up runs, cache primes or timing resets happen inside the timed region.
// run: the answer alone goes to stdout, figures and notes to stderr (or, with
// --json, one JSON object to stdout). bench: the same timed run over all
// --n-tokens, figures to stdout and the answer unprinted. chat: the REPL.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deployment.h"
#include "edgellm/session.h"

namespace CLI {
class App;
}

namespace edgellm {

enum class InferenceMode { run, chat, bench };

struct InferenceOptions {
  std::string model;
  std::string weights;
  std::string kv_cache;
  bool exact = false;
  std::string prompt;
  std::string prompt_file;  // -f: the prompt is this file's text
  std::string system;       // a system message before the prompt (chat template only)
  int n_tokens = 100;
  int threads = 0;
  int max_context = 0;
  bool raw = false;
  bool profile = false;
  bool chat = false;  // `run --chat`, the older spelling of `chat`
  bool json = false;
  bool ignore_eos = false;
  bool no_lookup = false;  // plain greedy decoding, no prompt-lookup drafts
  std::optional<uint64_t> seed;
  SamplerOptions sampling;
  std::vector<std::string> stop;  // stop strings: the answer ends before the first one
  // Structured output: the answer is a document of this JSON schema (its text,
  // or a file holding it), or with json_object any JSON object.
  std::string json_schema;
  bool json_object = false;
};

// --kv-cache and --exact, the arithmetic flags `serve` shares.
void add_arithmetic_options(CLI::App& cmd, std::string& kv_cache, bool& exact);

// Registers mode's flags on `cmd` (llama.cpp's short names beside the long ones),
// starting from the deployment's defaults (model, prompt, context) so --help shows them.
void add_inference_options(CLI::App& cmd, InferenceOptions& opt, const Deployment& deployment,
                           InferenceMode mode);

// Runs a parsed command; errors are thrown as edgellm::Error. A --json-schema
// that cannot be read or enforced is one error line and exit 2, before setup.
int run_inference(const Deployment& deployment, InferenceOptions opt, InferenceMode mode);

}  // namespace edgellm
