// What a route throws to answer with an OpenAI-style error: server.cpp sends it
// as {"error": {"message", "type", "param", "code"}} with its status.
#pragma once

#include <string>

namespace edgellm {

struct ApiError {
  int status;
  std::string message;
  std::string param;
  std::string code;
};

// 400 naming the request field at fault ("" for the body as a whole).
[[noreturn]] inline void bad(const std::string& param, const std::string& message) {
  throw ApiError{400, message, param, ""};
}

}  // namespace edgellm
