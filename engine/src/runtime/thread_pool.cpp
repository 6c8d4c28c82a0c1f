#include "edgellm/thread_pool.h"

#include <algorithm>

namespace edgellm {

namespace {
// Spin this many polls before sleeping: long enough to bridge the gap between
// consecutive ops of one decode step, short enough not to burn idle cores.
constexpr int kSpinPolls = 20000;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    epoch_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::drain() {
  for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) {
    task_(ctx_, i);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(size_t n, Task task, void* ctx) {
  {
    std::lock_guard lock(mutex_);
    n_ = n;
    task_ = task;
    ctx_ = ctx;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(n, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain();
  while (pending_.load(std::memory_order_acquire) != 0) {
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    int polls = 0;
    while (epoch_.load(std::memory_order_acquire) == seen && ++polls < kSpinPolls) {
    }
    if (epoch_.load(std::memory_order_acquire) == seen) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return epoch_.load(std::memory_order_acquire) != seen; });
    }
    std::unique_lock lock(mutex_);
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_) return;
    lock.unlock();
    drain();
  }
}

}  // namespace edgellm
