#include "responses_store.h"

namespace edgellm::responses {

void Store::put(const std::string& id, nlohmann::ordered_json items) {
  const size_t bytes = items.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {  // ids are random: never in practice
    bytes_ -= it->second.bytes;
    recency_.erase(it->second.lru);
    entries_.erase(it);
  }
  recency_.push_front(id);
  entries_[id] = {std::make_shared<const nlohmann::ordered_json>(std::move(items)), bytes,
                  recency_.begin()};
  bytes_ += bytes;
  while (recency_.size() > 1 && (recency_.size() > max_responses_ || bytes_ > max_bytes_)) {
    auto last = entries_.find(recency_.back());
    bytes_ -= last->second.bytes;
    entries_.erase(last);
    recency_.pop_back();
  }
}

std::shared_ptr<const nlohmann::ordered_json> Store::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  recency_.splice(recency_.begin(), recency_, it->second.lru);  // now the most recent
  return it->second.items;
}

}  // namespace edgellm::responses
