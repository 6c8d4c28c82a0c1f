// A note on a terminal while a long prefill runs: silent for the first second
// (and always when stderr is not a terminal), then an elapsed-time line that is
// erased when the work ends. It runs on its own sleeping thread, so the timed
// region is not touched.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace edgellm {

class Progress {
 public:
  explicit Progress(std::string what);
  ~Progress();  // stops and erases the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  void loop();
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace edgellm
