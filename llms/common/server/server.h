// The OpenAI-compatible HTTP server (cpp-httplib): GET /v1/models,
// POST /v1/chat/completions, POST /v1/completions, GET /health, GET /metrics,
// Anthropic's POST /v1/messages (anthropic_messages.h) and OpenAI's POST /v1/responses
// (responses_api.h) over the same chat route,
// POST /slots/{id}?action=save|restore|erase (slots.h) with --slot-save-path,
// POST /v1/embeddings and /v1/rerank (embeddings_route.h).
// Requests are validated here and answered with OpenAI-style JSON errors;
// generation runs on the Scheduler's continuous batch.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "edgellm/scheduler.h"
#include "edgellm/session.h"

namespace edgellm {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_name;                  // the id clients name in "model"
  size_t max_body_bytes = 1 << 20;         // larger bodies get 413
  std::chrono::milliseconds drain{10000};  // on shutdown, time given to running requests
  // A request's line and headers must arrive within this (and its body within as
  // long again), or it gets 408; see connections.h for the other connection limits.
  std::chrono::milliseconds header_timeout{10000};
  // A reasoning template's block gets at most this many tokens before its
  // close is forced (-1: the model closes it); a request's reasoning_budget
  // (Anthropic: thinking.budget_tokens) takes its place.
  int reasoning_budget = -1;
  // POST /slots/{id}?action=save|restore writes and reads prefix-cache files
  // here (slots.h); empty: off.
  std::filesystem::path slot_save_path;
  SchedulerOptions scheduler;
};

class Server {
 public:
  Server(const Model& model, const ServerOptions& options);
  ~Server();

  // Binds and serves until stop(); false (with a message on stderr) when the
  // address cannot be bound.
  bool run();
  // From any thread: refuse new requests (503), let running ones finish for
  // options.drain, cancel the rest, close the listener.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edgellm
