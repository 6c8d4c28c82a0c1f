#include "inference_driver.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "chat_repl.h"
#include "edgellm/error.h"
#include "edgellm/session.h"
#include "profile_report.h"

namespace edgellm {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Options {
  std::string model;
  std::string weights;
  std::string prompt;
  int n_tokens = 100;
  int threads = 0;
  int max_context = 4096;
  bool raw = false;
  bool profile = false;
  bool chat = false;
  SamplerOptions sampling;
};

// Instruct checkpoints get the chat template (what production feeds them);
// base checkpoints and --raw get the text as is.
std::vector<int32_t> prompt_tokens(const Session& session, const std::string& prompt, bool raw) {
  if (!raw && session.chat_template().available()) {
    const ChatMessage user{"user", prompt};
    return session.tokenizer().encode(session.chat_template().render({&user, 1}, true));
  }
  return session.tokenizer().encode(prompt, /*add_special_tokens=*/true);
}

int run(const Deployment& deployment, const Options& opt) {
  // ---- setup: ONE-TIME, outside the timed region ---------------------------
  const auto setup_start = Clock::now();
  Session session;
  SessionOptions so;
  so.threads = opt.threads;
  so.max_context = opt.max_context;
  so.profile = opt.profile;
  so.weights = opt.weights;
  session.setup(resolve_model(deployment, opt.model), so);
  const double setup_ms = ms_since(setup_start);
  if (opt.chat) {
    Sampler sampler(opt.sampling);
    run_chat(session, sampler, opt.n_tokens, opt.raw, std::cin, std::cout);
    return 0;
  }
  const std::vector<int32_t> prompt = prompt_tokens(session, opt.prompt, opt.raw);
  check(prompt.size() < static_cast<size_t>(session.max_context()),
        "prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context of " +
            std::to_string(session.max_context()) +
            " tokens (raise --max-context or shorten --prompt)");
  const int n_tokens =
      std::min<int>(opt.n_tokens, session.max_context() - static_cast<int>(prompt.size()));
  Sampler sampler(opt.sampling);
  StreamDecoder stream(session.tokenizer());

  // ---- timed region: prefill + decode loop ---------------------------------
  const auto prefill_start = Clock::now();
  int32_t next = sampler.sample(session.prefill(prompt));
  const double ttft_ms = ms_since(prefill_start);
  int generated = 1, decode_steps = 0;
  std::cout << stream.push(next) << std::flush;
  const auto decode_start = Clock::now();
  for (int pos = static_cast<int>(prompt.size());
       generated < n_tokens && !session.config().is_eos(next); ++pos) {
    next = sampler.sample(session.decode_step(next, pos));
    ++decode_steps;
    ++generated;
    std::cout << stream.push(next) << std::flush;
  }
  const double decode_ms = ms_since(decode_start);
  // ---------------------------------------------------------------------------

  std::cout << stream.flush() << "\n\n";
  std::printf("prompt tokens:    %zu\n", prompt.size());
  std::printf("generated tokens: %d%s\n", generated,
              session.config().is_eos(next) ? " (stopped at EOS)" : "");
  std::printf("setup:            %.1f ms (untimed: load, pack, allocate; %d threads)\n", setup_ms,
              session.threads());
  std::printf("TTFT (prefill):   %.1f ms\n", ttft_ms);
  std::printf("TPS (decode):     %.2f tokens/s (%d steps, %.2f ms/token)\n",
              decode_steps > 0 ? decode_steps * 1000.0 / decode_ms : 0.0, decode_steps,
              decode_steps > 0 ? decode_ms / decode_steps : 0.0);
  if (opt.profile) print_profile(session, prompt.size(), decode_steps);
  return 0;
}

}  // namespace

std::filesystem::path model_store() {
  if (const char* env = std::getenv("EDGELLM_MODELS"); env && *env) return env;
  return EDGELLM_DEFAULT_STORE;
}

std::filesystem::path resolve_model(const Deployment& deployment, const std::string& choice) {
  if (auto it = deployment.models.find(choice); it != deployment.models.end()) {
    const auto dir = model_store() / it->second;  // a directory, or a .gguf file in one
    check(std::filesystem::is_directory(dir) || std::filesystem::is_regular_file(dir),
          dir.string() + ": checkpoint for --model " + choice +
              " not found (run `make fetch`, or set MODEL=<checkpoint dir>)");
    return dir;
  }
  const bool gguf = std::filesystem::path(choice).extension() == ".gguf";
  if (!std::filesystem::is_directory(choice) &&
      !(gguf && std::filesystem::is_regular_file(choice))) {
    std::string known;
    for (const auto& [key, dir] : deployment.models) known += (known.empty() ? "" : ", ") + key;
    throw Error("--model " + choice + ": neither a known choice (" + known +
                ") nor a checkpoint directory or .gguf file");
  }
  return choice;
}

int run_inference_main(const Deployment& deployment, int argc, char** argv) {
  Options opt;
  opt.model = deployment.default_model;
  opt.prompt = deployment.default_prompt;
  CLI::App app{deployment.name + " inference: setup once, then timed prefill + decode"};
  app.add_option("--model", opt.model,
                 "checkpoint: a known choice, a checkpoint directory or a .gguf file in one")
      ->capture_default_str();
  app.add_option("--weights", opt.weights,
                 "quantize a bf16 checkpoint's matrices at setup (GGUF files run as stored)")
      ->check(CLI::IsMember({"q8_0", "q4_0"}));
  app.add_option("--prompt", opt.prompt, "prompt text")->capture_default_str();
  app.add_option("--n-tokens", opt.n_tokens, "tokens to generate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", opt.threads, "worker threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-context", opt.max_context, "KV cache positions")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--raw", opt.raw, "feed the prompt as raw text, without the chat template");
  app.add_flag("--chat", opt.chat,
               "interactive chat REPL (Ctrl-D quits); --n-tokens caps each reply");
  app.add_flag("--profile", opt.profile, "print the per-phase and per-kernel time breakdown");
  app.add_option("--temperature", opt.sampling.temperature, "0 = greedy")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", opt.sampling.top_k, "sample among the k most likely (0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", opt.sampling.top_p, "nucleus sampling mass (1 = off)")
      ->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--seed", opt.sampling.seed, "sampling seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    return run(deployment, opt);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}

}  // namespace edgellm
