#include "connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace edgellm {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// After an early error, the rest of the request is read and dropped this long
// before the close: closing with unread bytes would send a reset that can
// destroy the error reply before the client reads it.
constexpr milliseconds kLinger{2000};

struct Conn {
  enum class State { idle, request, closing };
  int fd = -1;
  State state = State::request;
  std::string buf;  // received and not yet consumed
  Clock::time_point deadline;
  size_t scanned = 0;  // bytes of buf searched for the end of the headers
  size_t lines = 0;    // line ends among them
  size_t need = 0;     // bytes the request needs before a worker gets it (0: headers not in)
  bool chunked = false;
  size_t served = 0;
};

int wait_ms(Clock::time_point deadline, milliseconds cap) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp(left, milliseconds(0), cap).count());
}

bool wait_for(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  int r;
  do {
    r = ::poll(&p, 1, ms);
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

// False once the peer closed its end (FIN) or reset the connection.
bool peer_open(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return !(::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
}

// The connection this worker thread is serving a request on (-1: none).
thread_local int serving_fd = -1;

const char* status_text(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Error";
  }
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// How the request's body is framed, or the error to answer instead.
struct Framing {
  int status = 0;
  std::string message;
  size_t content_length = 0;
  bool chunked = false;
  size_t expect_at = 0;  // offset of an "Expect: 100-continue" line, 0 if none
};

// `head`: the request line and header lines, CRLF-separated, without the blank line.
Framing parse_framing(std::string_view head, size_t max_body) {
  Framing f;
  const size_t eol = std::min(head.find("\r\n"), head.size());
  const std::string_view method = head.substr(0, head.find(' '));
  bool has_length = false;
  for (size_t pos = eol + 2; pos < head.size();) {
    const size_t end = std::min(head.find("\r\n", pos), head.size());
    const std::string_view line = head.substr(pos, end - pos);
    pos = end + 2;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // httplib skips such lines too
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-length") {
      // Digits only: "-5", "+5", "0x10" and "" are malformed, not "too large".
      if (value.empty() ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return {400, "malformed Content-Length '" + std::string(value) + "'"};
      const size_t n = value.size() > 18 ? SIZE_MAX : std::stoull(std::string(value));
      if (has_length && n != f.content_length) return {400, "conflicting Content-Length headers"};
      has_length = true;
      f.content_length = n;
    } else if (name == "expect" && lower(value) == "100-continue") {
      f.expect_at = static_cast<size_t>(line.data() - head.data());
    } else if (name == "transfer-encoding") {
      if (lower(value) != "chunked")
        return {400, "unsupported Transfer-Encoding '" + std::string(value) + "'"};
      f.chunked = true;
    }
  }
  if (f.chunked && has_length) return {400, "both Content-Length and Transfer-Encoding"};
  if (has_length && f.content_length > max_body)
    return {413, "the request body exceeds " + std::to_string(max_body) + " bytes"};
  if (!has_length && !f.chunked && (method == "POST" || method == "PUT" || method == "PATCH"))
    return {411, "a request body needs Content-Length or Transfer-Encoding: chunked"};
  return f;
}

void address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if ((peer ? ::getpeername : ::getsockname)(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return;
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

// A worker's view of one connection: the bytes the poller read first, then the
// socket (non-blocking; each wait bounded by io_timeout and the request's deadline).
class ConnStream : public httplib::Stream {
 public:
  ConnStream(Conn& c, const ConnectionLimits& limits)
      : c_(c),
        limits_(limits),
        raw_cap_(2 * limits.max_body_bytes + 64 * 1024) {}  // chunk framing of a full body

  bool is_readable() const override {
    return pos_ < c_.buf.size() ||
           wait_for(c_.fd, POLLIN, wait_ms(c_.deadline, limits_.io_timeout));
  }
  // A client that closed its end is gone: no write to it is worth waiting for.
  bool is_writable() const override {
    return peer_open(c_.fd) &&
           wait_for(c_.fd, POLLOUT, static_cast<int>(limits_.io_timeout.count()));
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == c_.buf.size()) {
      const ssize_t n = fill();
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, c_.buf.size() - pos_);
    std::memcpy(ptr, c_.buf.data() + pos_, n);
    pos_ += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    const std::string_view out(ptr, size);
    if (out.starts_with("HTTP/1.1 ") && out.find("\r\nConnection: close\r\n") != out.npos)
      said_close_ = true;
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!is_writable()) return -1;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(c_.fd, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(c_.fd, false, ip, port);
  }
  socket_t socket() const override { return c_.fd; }

  // Drops what the request consumed from the connection's buffer (a pipelined
  // next request stays); returns how many bytes the request consumed.
  size_t finish() {
    c_.buf.erase(0, pos_);
    pos_ = 0;
    return consumed_;
  }
  bool said_close() const { return said_close_; }

 private:
  ssize_t fill() {
    c_.buf.erase(0, pos_);
    pos_ = 0;
    if (raw_ >= raw_cap_) return -1;
    char tmp[4096];
    for (;;) {
      const int ms = wait_ms(c_.deadline, limits_.io_timeout);
      if (ms == 0 || !wait_for(c_.fd, POLLIN, ms)) return -1;  // the body's time is up
      const ssize_t n = ::recv(c_.fd, tmp, sizeof(tmp), 0);
      if (n > 0) {
        c_.buf.append(tmp, static_cast<size_t>(n));
        raw_ += static_cast<size_t>(n);
        return n;
      }
      if (n == 0) return 0;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    }
  }

  Conn& c_;
  const ConnectionLimits& limits_;
  const size_t raw_cap_;
  size_t pos_ = 0, consumed_ = 0, raw_ = 0;
  bool said_close_ = false;
};

}  // namespace

bool client_gone() {
  return serving_fd >= 0 && !peer_open(serving_fd);
}

struct GuardedHttpServer::Impl {
  GuardedHttpServer& server;
  const ConnectionLimits limits;
  const EarlyError early_error;
  int epoll_fd = -1, wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::once_flag stopped;

  std::mutex mutex;
  std::vector<std::unique_ptr<Conn>> inbox;  // new and returned connections, for the poller
  std::deque<std::unique_ptr<Conn>> ready;   // complete requests, for the workers
  std::condition_variable ready_cv;

  std::unordered_map<int, std::unique_ptr<Conn>> waiting;  // poller thread only
  std::thread poller;
  std::vector<std::thread> workers;

  Impl(GuardedHttpServer& s, const ConnectionLimits& l, EarlyError e)
      : server(s), limits(l), early_error(std::move(e)) {
    epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev);
    poller = std::thread([this] { poll_loop(); });
    for (size_t i = 0; i < std::max<size_t>(limits.workers, 1); ++i)
      workers.emplace_back([this] { work_loop(); });
  }

  void stop() {
    std::call_once(stopped, [this] {
      stopping = true;
      wake();
      ready_cv.notify_all();
      poller.join();
      for (auto& w : workers) w.join();
      for (auto& c : inbox) ::close(c->fd);
      ::close(epoll_fd);
      ::close(wake_fd);
    });
  }

  void wake() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }

  void hand_to_poller(std::unique_ptr<Conn> c) {
    if (stopping) {
      ::close(c->fd);
      return;
    }
    {
      const std::lock_guard lock(mutex);
      inbox.push_back(std::move(c));
    }
    wake();
  }

  // --- the poller: connections waiting for (the rest of) a request ---

  void poll_loop() {
    epoll_event events[64];
    while (!stopping) {
      const int n = ::epoll_wait(epoll_fd, events, 64, 100);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == wake_fd) {
          uint64_t count;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd, &count, sizeof(count));
          take_inbox();
        } else if (auto it = waiting.find(events[i].data.fd); it != waiting.end()) {
          on_readable(*it->second);
        }
      }
      expire();
    }
    for (auto& [fd, c] : waiting) ::close(fd);
    waiting.clear();
  }

  void take_inbox() {
    std::vector<std::unique_ptr<Conn>> taken;
    {
      const std::lock_guard lock(mutex);
      taken.swap(inbox);
    }
    for (auto& c : taken) {
      const bool fresh = c->served == 0 && c->buf.empty();
      if (fresh && waiting.size() >= limits.max_connections) {
        ::close(c->fd);  // full: a flood of idle connections costs the newest one
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = c->fd;
      ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &ev);
      Conn& conn = *c;
      waiting[c->fd] = std::move(c);
      examine(conn);  // a pipelined request may be in the buffer already
    }
  }

  void drop(Conn& c) {
    const int fd = c.fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    waiting.erase(fd);  // destroys c
  }

  void on_readable(Conn& c) {
    char tmp[16 * 1024];
    for (;;) {
      size_t want = sizeof(tmp);
      if (c.state != Conn::State::closing) {
        const size_t cap = c.need ? c.need : limits.max_header_bytes + 1;
        if (c.buf.size() >= cap) break;
        want = std::min(want, cap - c.buf.size());
      }
      const ssize_t n = ::recv(c.fd, tmp, want, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return drop(c);  // closed by the client (or reset)
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (c.state == Conn::State::closing) continue;  // lingering: dropped
      if (c.state == Conn::State::idle) {
        c.state = Conn::State::request;
        c.deadline = Clock::now() + limits.header_timeout;
      }
      c.buf.append(tmp, static_cast<size_t>(n));
    }
    examine(c);
  }

  // Checks the request so far; answers an error, hands a complete request to
  // a worker, or waits for more.
  void examine(Conn& c) {
    if (c.state != Conn::State::request) return;
    if (c.need == 0) {
      const size_t from = c.scanned >= 3 ? c.scanned - 3 : 0;
      const size_t end = c.buf.find("\r\n\r\n", from);
      if (end == std::string::npos) {
        c.lines += static_cast<size_t>(std::count(c.buf.begin() + c.scanned, c.buf.end(), '\n'));
        c.scanned = c.buf.size();
        if (c.buf.size() > limits.max_header_bytes)
          return reject(
              c, 431,
              "the request headers exceed " + std::to_string(limits.max_header_bytes) + " bytes");
        if (c.lines > limits.max_headers + 1)
          return reject(c, 431, "more than " + std::to_string(limits.max_headers) + " headers");
        return;
      }
      const size_t head = end + 4;
      if (head > limits.max_header_bytes)
        return reject(
            c, 431,
            "the request headers exceed " + std::to_string(limits.max_header_bytes) + " bytes");
      // Line ends before the blank line: the request line and one per header.
      const size_t lines =
          static_cast<size_t>(std::count(c.buf.begin(), c.buf.begin() + end + 2, '\n'));
      if (lines > limits.max_headers + 1)
        return reject(c, 431, "more than " + std::to_string(limits.max_headers) + " headers");
      Framing f = parse_framing(std::string_view(c.buf).substr(0, end), limits.max_body_bytes);
      if (f.status) return reject(c, f.status, f.message);
      c.chunked = f.chunked;
      c.need = head + f.content_length;
      c.deadline = Clock::now() + limits.header_timeout;  // the body's own time
      if (f.expect_at) {
        // The client waits for this before it sends the body, which we wait
        // for; httplib must not send a second one ("Expect" becomes "Xxpect").
        c.buf[f.expect_at] = 'X';
        static constexpr std::string_view go = "HTTP/1.1 100 Continue\r\n\r\n";
        [[maybe_unused]] const ssize_t n =
            ::send(c.fd, go.data(), go.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
    if (c.buf.size() < c.need) return;
    const int fd = c.fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    auto it = waiting.find(fd);
    std::unique_ptr<Conn> conn = std::move(it->second);
    waiting.erase(it);
    {
      const std::lock_guard lock(mutex);
      ready.push_back(std::move(conn));
    }
    ready_cv.notify_one();
  }

  // An OpenAI-style error written straight to the socket, then a lingering close.
  void reject(Conn& c, int status, const std::string& message) {
    const std::string body = early_error(status, message);
    const std::string reply =
        "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    // Best effort: a reply this small fits an empty socket buffer.
    [[maybe_unused]] const ssize_t n =
        ::send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    linger(c);
  }

  void linger(Conn& c) const {
    ::shutdown(c.fd, SHUT_WR);
    c.state = Conn::State::closing;
    c.buf.clear();
    c.deadline = Clock::now() + kLinger;
  }

  void expire() {
    const auto now = Clock::now();
    std::vector<Conn*> late;
    for (auto& [fd, c] : waiting)
      if (c->deadline <= now) late.push_back(c.get());
    for (Conn* c : late) {
      if (c->state == Conn::State::request)
        reject(*c, 408,
               "the request did not arrive within " +
                   std::to_string(limits.header_timeout.count()) + " ms");
      else
        drop(*c);  // idle keep-alive, or lingering done
    }
  }

  // --- the workers: one complete request at a time ---

  void work_loop() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock lock(mutex);
        ready_cv.wait(lock, [&] { return stopping || !ready.empty(); });
        if (ready.empty()) return;
        c = std::move(ready.front());
        ready.pop_front();
      }
      if (stopping) {
        ::close(c->fd);
        continue;
      }
      serve(std::move(c));
    }
  }

  void serve(std::unique_ptr<Conn> c) {
    ConnStream stream(*c, limits);
    const bool last = ++c->served >= limits.max_requests_per_connection || stopping;
    bool closed = false;
    serving_fd = c->fd;
    const bool ok = server.process_request(stream, last, closed, nullptr);
    serving_fd = -1;
    const size_t consumed = stream.finish();
    if (!ok) {
      ::close(c->fd);  // the client is gone, or a read or write failed
      return;
    }
    // A Content-Length body left unread (a route that answered without reading)
    // would be parsed as the next request.
    if (closed || last || stream.said_close() || (!c->chunked && consumed < c->need)) {
      linger(*c);
    } else {
      c->state = c->buf.empty() ? Conn::State::idle : Conn::State::request;
      c->deadline = Clock::now() + (c->buf.empty() ? limits.idle_timeout : limits.header_timeout);
    }
    c->need = c->scanned = c->lines = 0;
    c->chunked = false;
    hand_to_poller(std::move(c));
  }
};

namespace {

// Runs httplib's per-connection task inline on its accept thread: the task is
// our process_and_close_socket, which only hands the socket over.
class InlineQueue : public httplib::TaskQueue {
 public:
  explicit InlineQueue(std::function<void()> on_shutdown) : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

}  // namespace

GuardedHttpServer::GuardedHttpServer(const ConnectionLimits& limits, EarlyError early_error)
    : impl_(std::make_unique<Impl>(*this, limits, std::move(early_error))) {
  new_task_queue = [this] { return new InlineQueue([this] { impl_->stop(); }); };
  set_payload_max_length(limits.max_body_bytes);  // httplib's own check stays as a backstop
}

bool GuardedHttpServer::bind(const std::string& host, int port) {
  // httplib listens with a backlog of 5: a burst of connects (a client pool
  // opening, or a flood) overflows it while the accept thread waits for a core,
  // and each dropped SYN costs its client a 1 s retransmit. Linux takes a new
  // backlog from a second listen().
  return bind_to_port(host, port) && ::listen(svr_sock_, 1024) == 0;
}

GuardedHttpServer::~GuardedHttpServer() {
  impl_->stop();
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (impl_->stopping) {
    ::close(sock);
    return false;
  }
  ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Conn>();
  c->fd = sock;
  c->deadline = Clock::now() + impl_->limits.header_timeout;
  impl_->hand_to_poller(std::move(c));
  return true;
}

}  // namespace edgellm
