// Server metrics in the Prometheus text exposition format (GET /metrics).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace edgellm {

class Metrics {
 public:
  void count_response(int status);
  void add_tokens(size_t prompt, size_t generated);
  void add_cached_tokens(size_t prompt);             // prompt tokens loaded from the prefix cache
  void add_lookup(size_t drafted, size_t accepted);  // prompt-lookup draft tokens verified, kept
  void set_prefix_cache(size_t blocks, size_t bytes, uint64_t evictions);
  void observe_ttft(double seconds);
  void observe_token_latency(double seconds);  // between two tokens of one stream
  void set_queue(size_t waiting, size_t active);

  struct Snapshot {
    size_t waiting = 0, active = 0;
  };
  Snapshot load() const;
  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;    // upper bounds, seconds
    std::vector<uint64_t> counts;  // per bound, not cumulative
    uint64_t count = 0;
    double sum = 0;
    void observe(double v);
  };
  static Histogram make(std::vector<double> bounds);

  mutable std::mutex mutex_;
  std::map<int, uint64_t> responses_;  // by HTTP status
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  uint64_t lookup_drafted_ = 0, lookup_accepted_ = 0;
  size_t cache_blocks_ = 0, cache_bytes_ = 0;
  uint64_t cache_evictions_ = 0;
  size_t waiting_ = 0, active_ = 0;
  Histogram ttft_ = make({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  Histogram token_ = make({0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56});
};

}  // namespace edgellm
