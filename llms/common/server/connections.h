// The HTTP server's connection handling, hardened against hostile clients.
//
// Debian's cpp-httplib (0.11, compiled) gives each connection a pool thread from
// accept to close, restarts the read timeout with every byte, and limits neither
// the number nor the total size of headers, nor a chunked body. Here a waiting
// connection (its request still arriving, or idle between keep-alive requests)
// costs no thread: one epoll thread reads it under the limits below, and a worker
// gets it only once the request's headers and Content-Length body are in
// (a chunked body is read by the worker, under the same deadline and the route's
// --max-body). httplib still parses and routes each request (process_request).
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace edgellm {

struct ConnectionLimits {
  size_t max_header_bytes = 16 * 1024;  // request line + headers; 431 beyond
  size_t max_headers = 100;             // header lines; 431 beyond
  // The request line and headers must be in this long after the connection opens
  // (or after the first byte of a keep-alive request); the body gets as long again. 408.
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds idle_timeout{5000};  // keep-alive wait for the next request
  std::chrono::milliseconds io_timeout{5000};    // one read or write by a worker
  size_t max_body_bytes = 1 << 20;               // a Content-Length beyond: 413
  size_t max_connections = 1024;                 // waiting connections; new ones beyond are closed
  size_t max_requests_per_connection = 100;
  size_t workers = 16;  // requests served at once (SSE streams hold theirs)
};

// The JSON body of an error answered before httplib sees the request (400, 408,
// 411, 413, 431); also where the server counts it.
using EarlyError = std::function<std::string(int status, const std::string& message)>;

// On a worker thread serving a request: whether its client has closed the
// connection (FIN or reset), so its generation can stop at once.
bool client_gone();

class GuardedHttpServer : public httplib::Server {
 public:
  GuardedHttpServer(const ConnectionLimits& limits, EarlyError early_error);
  ~GuardedHttpServer() override;

  // bind_to_port with a listen backlog of 1024 instead of httplib's 5.
  bool bind(const std::string& host, int port);

 private:
  // Called on httplib's accept thread (an inline task queue): hands the socket
  // to the waiting-connection thread and returns.
  bool process_and_close_socket(socket_t sock) override;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace edgellm
