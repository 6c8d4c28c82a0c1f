// `edgellm serve`: the OpenAI-compatible server over one model.
//   edgellm serve [--deployment NAME] [-m choice | checkpoint | store entry] [--host --port ...]
// SIGTERM / SIGINT drain the running requests (up to --drain seconds), cancel
// the rest and exit 0.
#pragma once

#include <string>

#include "deployment.h"
#include "server.h"

namespace CLI {
class App;
}

namespace edgellm {

struct ServeOptions {
  std::string model;  // a choice of the deployment, a path, or a directory in the model store
  ServerOptions server;
  int threads = 0;
  int max_context = 2048;
  std::string kv_cache;
  bool exact = false;
  double drain_seconds = 10;
  double header_timeout_seconds = 10;
};

void add_serve_options(CLI::App& cmd, ServeOptions& opt, const Deployment& deployment);

// Serves until SIGTERM / SIGINT; errors are thrown as edgellm::Error.
int run_serve(const Deployment& deployment, ServeOptions opt);

}  // namespace edgellm
