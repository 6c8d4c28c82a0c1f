#include "responses_store.h"

namespace edgellm::responses {

void Store::put(const std::string& id, nlohmann::ordered_json items) {
  auto text = std::make_shared<const std::string>(
      items.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {  // ids are random: never in practice
    bytes_ -= it->second.text->size();
    recency_.erase(it->second.lru);
    entries_.erase(it);
  }
  recency_.push_front(id);
  bytes_ += text->size();
  entries_[id] = {std::move(text), recency_.begin()};
  while (recency_.size() > 1 && (recency_.size() > max_responses_ || bytes_ > max_bytes_)) {
    auto last = entries_.find(recency_.back());
    bytes_ -= last->second.text->size();
    entries_.erase(last);
    recency_.pop_back();
  }
}

std::optional<nlohmann::ordered_json> Store::get(const std::string& id) {
  std::shared_ptr<const std::string> text;
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    recency_.splice(recency_.begin(), recency_, it->second.lru);  // now the most recent
    text = it->second.text;
  }
  return nlohmann::ordered_json::parse(*text);  // our own output: parsed outside the lock
}

}  // namespace edgellm::responses
