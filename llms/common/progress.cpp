#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace edgellm {

namespace {
// EDGELLM_PROGRESS_DELAY_MS lets the tests see the line without a slow prompt.
std::chrono::milliseconds first_note_delay() {
  if (const char* env = std::getenv("EDGELLM_PROGRESS_DELAY_MS"); env && *env)
    return std::chrono::milliseconds(std::atoi(env));
  return std::chrono::milliseconds(1000);
}
}  // namespace

Progress::Progress(std::string what) : what_(std::move(what)) {
  if (isatty(STDERR_FILENO)) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Progress::loop() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  if (cv_.wait_for(lock, first_note_delay(), [this] { return done_; })) return;
  do {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r[%s: %.1f s]", what_.c_str(), s);
    std::fflush(stderr);
  } while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return done_; }));
  std::fprintf(stderr, "\r\033[K");  // erase the note
  std::fflush(stderr);
}

}  // namespace edgellm
