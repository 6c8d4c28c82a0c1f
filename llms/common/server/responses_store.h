// The conversations previous_response_id continues: each stored response's
// items (its input, history included, then its output) in memory, bounded by
// a count and a byte budget, the least recently used evicted first. Items are
// kept as their JSON text, so the budget is the memory they take.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace edgellm::responses {

class Store {
 public:
  // At most `max_responses` entries and `max_bytes` of items (as JSON text);
  // one entry larger than `max_bytes` is kept alone until the next is put.
  Store(size_t max_responses, size_t max_bytes)
      : max_responses_(max_responses), max_bytes_(max_bytes) {}

  // Keeps `items` under `id`, evicting the least recently used past the bounds.
  void put(const std::string& id, nlohmann::ordered_json items);
  // The items stored under `id` (now the most recently used), or nullopt when
  // there are none (never stored, or evicted).
  std::optional<nlohmann::ordered_json> get(const std::string& id);

 private:
  struct Entry {
    std::shared_ptr<const std::string> text;  // the items' JSON
    std::list<std::string>::iterator lru;     // its place in recency_
  };
  const size_t max_responses_, max_bytes_;
  std::mutex mutex_;
  std::list<std::string> recency_;  // ids, most recently used first
  std::unordered_map<std::string, Entry> entries_;
  size_t bytes_ = 0;
};

// The bounds `edgellm serve` keeps: 256 responses, 64 MiB of items.
constexpr size_t kStoredResponses = 256;
constexpr size_t kStoredBytes = size_t{64} << 20;

}  // namespace edgellm::responses
