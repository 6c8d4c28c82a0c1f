// edgellm_server: the OpenAI-compatible server over one model.
//   edgellm_server --model <checkpoint dir | name in the model store> [--host --port ...]
// SIGTERM / SIGINT drain the running requests (up to --drain seconds), cancel
// the rest and exit 0.
#include <csignal>
#include <cstdio>
#include <thread>

#include <pthread.h>
#include <CLI/CLI.hpp>

#include "edgellm/deployment.h"
#include "edgellm/error.h"
#include "inference_driver.h"
#include "server.h"

int main(int argc, char** argv) {
  using namespace edgellm;
  std::string model = "smollm2-135m-instruct";
  ServerOptions so;
  int threads = 0, max_context = 2048;
  std::string kv_cache;
  bool exact = false;
  double drain_seconds = 10, header_timeout_seconds = 10;
  CLI::App app{"edgellm_server: OpenAI-compatible HTTP server with continuous batching"};
  app.add_option("--model", model, "checkpoint directory, or its name in the model store")
      ->capture_default_str();
  app.set_version_flag("--version", "edgellm_server " EDGELLM_VERSION);
  app.add_option("--name", so.model_name,
                 "model id clients send (default: the checkpoint directory's name; for a "
                 "model.gguf, that name + -gguf)");
  app.add_option("--host", so.host, "address to listen on")->capture_default_str();
  app.add_option("--port", so.port, "port")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--threads", threads, "engine threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-context", max_context, "KV cache positions per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--kv-cache", kv_cache,
                 "KV cache element type: fp32, bf16 or q8_0 (default: EDGELLM_KV_CACHE, else "
                 "the precision's: fast bf16, exact fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "q8_0"}));
  app.add_flag("--exact", exact,
               "the gate's exact fp32 arithmetic instead of the fast default "
               "(EDGELLM_PRECISION=exact)");
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
  app.add_option("--max-body", so.max_body_bytes, "largest request body in bytes (413 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--drain", drain_seconds, "seconds running requests get on SIGTERM")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--header-timeout", header_timeout_seconds,
                 "seconds a request's line and headers may take to arrive (and its body as "
                 "long again); 408 beyond")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see --help)\n", e.what());
    return 2;
  }
  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    // A checkpoint directory or a .gguf file in one, as a path or a model-store entry.
    auto is_model = [](const std::filesystem::path& p) {
      return std::filesystem::is_directory(p) ||
             (p.extension() == ".gguf" && std::filesystem::is_regular_file(p));
    };
    std::filesystem::path dir = model;
    if (!is_model(dir)) dir = model_store() / model;
    if (!is_model(dir))
      throw Error(model + ": no such checkpoint directory or .gguf file (nor in the model store " +
                  model_store().string() + ")");
    if (so.model_name.empty()) so.model_name = model_id(dir);
    Model m;
    SessionOptions mo;
    mo.threads = threads;
    mo.max_context = max_context;
    mo.kv_cache = kv_cache;
    if (exact) mo.precision = "exact";
    m.setup(dir, with_environment_defaults(mo));
    std::fprintf(stderr, "edgellm server: arithmetic %s\n",
                 describe_exec_config(m.exec_config()).c_str());
    so.drain = std::chrono::milliseconds(static_cast<int64_t>(drain_seconds * 1000));
    so.header_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(header_timeout_seconds * 1000));
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
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}
