// How the protocol translations (Anthropic's Messages, OpenAI's Responses) read a
// request body: a refusal names the field as the client wrote it, a null field is
// absent, and a field they do not implement is refused, never ignored.
#pragma once

#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "edgellm/error.h"

namespace edgellm::protocol {

using ojson = nlohmann::ordered_json;

// A request the translation refuses: `param` names the field (as the client wrote it).
class RequestError : public Error {
 public:
  RequestError(std::string param, const std::string& message)
      : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

[[noreturn]] inline void bad(const std::string& param, const std::string& message) {
  throw RequestError(param, message);
}

// `object[name]`, or null when it is missing or null.
inline const ojson* field(const ojson& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// Refuses a key of `object` outside `known` (`where`: the object's path): an
// ignored key could change what the client expects back.
inline void check_keys(const ojson& object, const std::set<std::string>& known,
                       const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    if (value.is_null() || known.contains(key)) continue;
    const std::string at = where.empty() ? key : where + "." + key;
    bad(at, "unsupported field '" + at + "': this server does not implement it");
  }
}

}  // namespace edgellm::protocol
