// A fixed pool of worker threads for data-parallel kernels.
//
// Decode issues a few hundred small parallel ops per token, so dispatch must
// cost about a microsecond: a job is a plain function pointer plus context (no
// allocation per call), workers spin on an epoch counter for a while before
// sleeping, and the caller never waits for a worker that is asleep or slow to
// wake: items are claimed dynamically, so the caller simply does them itself.
//
// Protocol (why it is race-free; see thread_pool.cpp for the code):
//  * The job fields (task, ctx, n) are atomics written under a seqlock on
//    `epoch_` (odd while being written). A worker that read them while the
//    caller was already publishing the next job sees the epoch change and
//    retries, so it never runs one job's task with another job's context.
//  * Items are claimed by CAS on `claim_` = (job generation << 32 | next item).
//    A worker that lags behind by a whole job cannot claim an item of the new
//    job under the old job's task: the generation no longer matches.
//  * A worker adds to `done_` only for items it claimed; the caller returns
//    only when done_ == n, so no worker touches a job's ctx after run() ends.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace edgellm {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per hardware thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that take part in a job, the caller included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for i in [0, n) across the pool (the caller takes part) and
  // returns when all are done. One caller at a time. A call from inside a
  // running task (nested parallelism) runs serially on the calling thread.
  template <typename Fn>
  void parallel_for(size_t n, Fn&& fn) {
    if (n == 0) return;
    if (n == 1 || workers_.empty() || in_task_) {
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    run(
        n, [](void* ctx, size_t i) { (*static_cast<F*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Splits [0, n) into one contiguous chunk per thread: fn(begin, end), with
  // begin < end for every call.
  template <typename Fn>
  void parallel_chunks(size_t n, Fn&& fn) {
    const size_t parts = std::min<size_t>(static_cast<size_t>(size()), n);
    parallel_for(parts, [&](size_t p) { fn(n * p / parts, n * (p + 1) / parts); });
  }

 private:
  using Task = void (*)(void*, size_t);
  void run(size_t n, Task task, void* ctx);
  void worker_loop();
  // Spins, then sleeps, until the epoch is even and differs from `seen` (or
  // stop). Returns the new epoch.
  uint64_t wait_for_job(uint64_t seen);
  // Claims and runs items of generation `gen` until none is left; returns how
  // many this thread ran.
  size_t drain(uint32_t gen, size_t n, Task task, void* ctx);

  static thread_local bool in_task_;

  std::vector<std::thread> workers_;
  // Written by the caller per job, read by workers: each on its own cache line
  // so workers spinning on epoch_ do not slow the caller's claim/done traffic.
  alignas(64) std::atomic<uint64_t> epoch_{0};  // seqlock; even = job fields stable
  std::atomic<Task> task_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<size_t> n_{0};
  alignas(64) std::atomic<uint64_t> claim_{0};  // (generation << 32) | next item
  alignas(64) std::atomic<size_t> done_{0};     // items finished by workers
  alignas(64) std::atomic<int> sleepers_{0};    // workers blocked on wake_
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace edgellm
