#include "metrics.h"

#include <sstream>

namespace edgellm {

Metrics::Histogram Metrics::make(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size(), 0);
  h.bounds = std::move(bounds);
  return h;
}

void Metrics::Histogram::observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) {
      ++counts[i];
      break;
    }
  ++count;
  sum += v;
}

void Metrics::count_response(int status) {
  const std::lock_guard lock(mutex_);
  ++responses_[status];
}

void Metrics::add_tokens(size_t prompt, size_t generated) {
  const std::lock_guard lock(mutex_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::add_cached_tokens(size_t prompt) {
  const std::lock_guard lock(mutex_);
  cached_tokens_ += prompt;
}

void Metrics::add_lookup(size_t drafted, size_t accepted) {
  const std::lock_guard lock(mutex_);
  lookup_drafted_ += drafted;
  lookup_accepted_ += accepted;
}

void Metrics::set_prefix_cache(size_t blocks, size_t bytes, uint64_t evictions) {
  const std::lock_guard lock(mutex_);
  cache_blocks_ = blocks;
  cache_bytes_ = bytes;
  cache_evictions_ = evictions;
}

void Metrics::observe_ttft(double seconds) {
  const std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::observe_token_latency(double seconds) {
  const std::lock_guard lock(mutex_);
  token_.observe(seconds);
}

void Metrics::set_queue(size_t waiting, size_t active) {
  const std::lock_guard lock(mutex_);
  waiting_ = waiting;
  active_ = active;
}

Metrics::Snapshot Metrics::load() const {
  const std::lock_guard lock(mutex_);
  return {waiting_, active_};
}

std::string Metrics::render() const {
  const std::lock_guard lock(mutex_);
  std::ostringstream out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  auto value = [&](const char* name, const char* type, const char* help, auto v) {
    header(name, type, help);
    out << name << ' ' << v << '\n';
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      out << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << cumulative << '\n';
    }
    out << name << "_bucket{le=\"+Inf\"} " << h.count << '\n';
    out << name << "_sum " << h.sum << '\n' << name << "_count " << h.count << '\n';
  };
  header("edgellm_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : responses_)
    out << "edgellm_requests_total{code=\"" << status << "\"} " << n << '\n';
  value("edgellm_prompt_tokens_total", "counter",
        "Prompt tokens, prefilled or loaded from the prefix cache.", prompt_tokens_);
  value("edgellm_prompt_tokens_cached_total", "counter",
        "Prompt tokens whose KV was loaded from the prefix cache, not prefilled.", cached_tokens_);
  value("edgellm_prefix_cache_blocks", "gauge", "Token blocks held by the prefix cache.",
        cache_blocks_);
  value("edgellm_prefix_cache_bytes", "gauge", "KV bytes held by the prefix cache.", cache_bytes_);
  value("edgellm_prefix_cache_evictions_total", "counter",
        "Blocks evicted from the prefix cache to stay within its budget.", cache_evictions_);
  value("edgellm_lookup_draft_tokens_total", "counter",
        "Prompt-lookup draft tokens verified (greedy requests decoding alone).", lookup_drafted_);
  value("edgellm_lookup_accepted_tokens_total", "counter",
        "Prompt-lookup draft tokens kept: decode steps saved.", lookup_accepted_);
  value("edgellm_generation_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  value("edgellm_queue_depth", "gauge", "Requests waiting for a free sequence slot.", waiting_);
  value("edgellm_active_requests", "gauge", "Requests holding a context (prefill or decode).",
        active_);
  histogram("edgellm_time_to_first_token_seconds", "Queue wait + prefill + first token.", ttft_);
  histogram("edgellm_inter_token_latency_seconds", "Time between two tokens of one stream.",
            token_);
  return out.str();
}

}  // namespace edgellm
