#include "serve_command.h"

#include <csignal>
#include <cstdio>
#include <thread>

#include <pthread.h>
#include <CLI/CLI.hpp>

#include "edgellm/error.h"
#include "inference_driver.h"
#include "server.h"

namespace edgellm {

namespace {

// A checkpoint directory or a .gguf file in one.
bool is_model(const std::filesystem::path& p) {
  return std::filesystem::is_directory(p) ||
         (p.extension() == ".gguf" && std::filesystem::is_regular_file(p));
}

// --model: a choice of the deployment, else a path, else an entry of the model store.
std::filesystem::path resolve_served_model(const Deployment& deployment, const std::string& model) {
  if (deployment.models.contains(model)) return deployment.resolve_model(model);
  std::filesystem::path dir = model;
  if (!is_model(dir)) dir = model_store() / model;
  if (!is_model(dir))
    throw Error(model + ": no such checkpoint directory or .gguf file (nor in the model store " +
                model_store().string() + ")");
  return dir;
}

}  // namespace

void add_serve_options(CLI::App& app, ServeOptions& opt, const Deployment& deployment) {
  opt.model = deployment.default_model;
  ServerOptions& so = opt.server;
  app.add_option("-m,--model", opt.model,
                 "a choice of the deployment, a checkpoint directory (or .gguf file in one), or "
                 "its name in the model store")
      ->capture_default_str();
  app.add_option("--name", so.model_name,
                 "model id clients send (default: the checkpoint directory's name; for a "
                 "model.gguf, that name + -gguf)");
  app.add_option("--host", so.host, "address to listen on")->capture_default_str();
  app.add_option("--port", so.port, "port")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("-t,--threads", opt.threads, "engine threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--max-context,--ctx-size", opt.max_context, "KV cache positions per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_arithmetic_options(app, opt.kv_cache, opt.exact);
  app.add_option("--parallel", so.scheduler.max_batch, "sequences decoded together")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--queue", so.scheduler.max_queue, "waiting requests beyond which 429 is returned")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--prefill-chunk", so.scheduler.prefill_chunk,
                 "prompt tokens prefilled between two decode steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--cache-mb", so.scheduler.cache_mb,
                 "prefix cache: MiB of prompt KV kept for reuse by later requests (0 = off)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--reasoning-budget", so.reasoning_budget,
                 "tokens a reasoning model may think (its <think> block) before the close is "
                 "forced; -1 = no limit, 0 = no thinking")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  app.add_option("--slot-save-path", so.slot_save_path,
                 "directory for POST /slots/{id}?action=save|restore: prefix-cache files that "
                 "keep a prompt's KV across restarts (off by default)");
  app.add_flag(
      "--no-lookup", [&](int64_t) { so.scheduler.lookup = false; },
      "no prompt-lookup decoding (on by default for a greedy request decoding alone)");
  app.add_option("--max-body", so.max_body_bytes, "largest request body in bytes (413 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--drain", opt.drain_seconds, "seconds running requests get on SIGTERM")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--header-timeout", opt.header_timeout_seconds,
                 "seconds a request's line and headers may take to arrive (and its body as "
                 "long again); 408 beyond")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

int run_serve(const Deployment& deployment, ServeOptions opt) {
  ServerOptions& so = opt.server;
  // Block the stop signals in every thread (before any starts); one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  if (!so.slot_save_path.empty()) {
    if (so.scheduler.cache_mb == 0)
      throw Error("--slot-save-path saves prefix-cache blocks: it needs --cache-mb > 0");
    std::error_code ec;
    std::filesystem::create_directories(so.slot_save_path, ec);
    if (ec || !std::filesystem::is_directory(so.slot_save_path))
      throw Error("--slot-save-path " + so.slot_save_path.string() + ": not a directory" +
                  (ec ? " (" + ec.message() + ")" : ""));
  }
  const std::filesystem::path dir = resolve_served_model(deployment, opt.model);
  if (so.model_name.empty()) so.model_name = model_id(dir);
  Model m;
  SessionOptions mo;
  mo.threads = opt.threads;
  mo.max_context = opt.max_context;
  mo.kv_cache = opt.kv_cache;
  if (opt.exact) mo.precision = "exact";
  m.setup(dir, with_environment_defaults(mo));
  std::fprintf(stderr, "edgellm server: arithmetic %s\n",
               describe_exec_config(m.exec_config()).c_str());
  so.drain = std::chrono::milliseconds(static_cast<int64_t>(opt.drain_seconds * 1000));
  so.header_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(opt.header_timeout_seconds * 1000));
  Server server(m, so);
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "edgellm server: %s, draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server.stop();
  });
  const bool ok = server.run();
  server.stop();
  if (ok) {
    signals.join();
  } else {
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    return 1;
  }
  std::fprintf(stderr, "edgellm server: stopped\n");
  return 0;
}

}  // namespace edgellm
