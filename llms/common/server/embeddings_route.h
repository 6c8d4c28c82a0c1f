// POST /v1/embeddings (OpenAI's shape) and POST /v1/rerank (llama-server's and
// Jina's): a checked request -> the engine's pooling (edgellm/pooling.h) ->
// the reply. server.cpp reads the body, checks "model" and refuses the fields
// outside these routes' sets; this file checks the rest of each request.
#pragma once

#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "edgellm/session.h"

namespace edgellm {

extern const std::set<std::string> kEmbeddingFields;
extern const std::set<std::string> kRerankFields;

class PoolingRoutes {
 public:
  explicit PoolingRoutes(const Model& model) : model_(model) {}

  nlohmann::json embeddings(const nlohmann::json& body, const std::string& model_name);
  nlohmann::json rerank(const nlohmann::json& body, const std::string& model_name);

 private:
  // One KV cache for every pooling request, made at the first (a server that
  // never embeds allocates none); requests take turns on it.
  Context& context();

  const Model& model_;
  std::mutex mutex_;  // held for a whole request: it owns context_
  Context context_;
};

}  // namespace edgellm
