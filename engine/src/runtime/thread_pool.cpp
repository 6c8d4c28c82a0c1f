#include "edgellm/thread_pool.h"

#include <algorithm>
#include <cassert>
#include <chrono>

namespace edgellm {

namespace {

// How long an idle worker spins before sleeping: long enough to bridge the
// gaps between the ops of one decode step and between steps (sampling, the
// driver's bookkeeping), short enough not to burn a core when the engine idles.
constexpr auto kSpinTime = std::chrono::milliseconds(2);

// Caller's polls for workers' items before it starts yielding: ~50-100 us.
constexpr uint32_t kPollsBeforeYield = 2048;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr uint32_t generation_of(uint64_t epoch) {
  return static_cast<uint32_t>(epoch >> 1);
}

}  // namespace

thread_local bool ThreadPool::in_task_ = false;

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  // Bump by a whole generation so spinning workers see a change; the lock
  // orders the bump against a worker that is about to block (see run()).
  {
    std::lock_guard lock(mutex_);
    epoch_.fetch_add(2, std::memory_order_seq_cst);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

size_t ThreadPool::drain(uint32_t gen, size_t n, Task task, void* ctx) {
  size_t ran = 0;
  uint64_t v = claim_.load(std::memory_order_relaxed);
  for (;;) {
    // The generation check keeps a lagging thread from claiming (and running
    // with the wrong task) an item of a later job.
    if (static_cast<uint32_t>(v >> 32) != gen || (v & 0xffffffffu) >= n) break;
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_relaxed)) continue;
    task(ctx, static_cast<size_t>(v & 0xffffffffu));
    ++ran;
    v = claim_.load(std::memory_order_relaxed);
  }
  return ran;
}

void ThreadPool::run(size_t n, Task task, void* ctx) {
  assert(n < (uint64_t{1} << 32) && "claim_ holds the item index in 32 bits");
  // Publish the job under the seqlock: odd epoch while the fields change.
  const uint64_t e = epoch_.load(std::memory_order_relaxed);
  epoch_.store(e + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  task_.store(task, std::memory_order_relaxed);
  ctx_.store(ctx, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = generation_of(e + 2);
  claim_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_relaxed);
  // seq_cst store then seq_cst load of sleepers_ pairs with the worker's
  // seq_cst increment then load of epoch_: one of the two sees the other, so
  // a worker never sleeps through a job it should have seen.
  epoch_.store(e + 2, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard lock(mutex_); }
    wake_.notify_all();
  }

  in_task_ = true;
  const size_t mine = drain(gen, n, task, ctx);
  in_task_ = false;
  // Wait for items claimed by workers. Spin first (they usually finish within
  // microseconds); if a worker was preempted mid-item (a shared 2-core
  // machine), yield so the spinning does not hold the core it needs.
  for (uint32_t polls = 0; done_.load(std::memory_order_acquire) + mine < n; ++polls) {
    cpu_relax();
    if (polls >= kPollsBeforeYield) std::this_thread::yield();
  }
}

uint64_t ThreadPool::wait_for_job(uint64_t seen) {
  const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
  for (uint32_t polls = 0;; ++polls) {
    const uint64_t e = epoch_.load(std::memory_order_acquire);
    if (e != seen && (e & 1) == 0) return e;
    if (stop_.load(std::memory_order_relaxed)) return e;
    cpu_relax();
    // Reading the clock costs ~20 ns; do it rarely.
    if ((polls & 255) == 255 && std::chrono::steady_clock::now() > spin_until) break;
  }
  std::unique_lock lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  // An odd epoch wakes us too: the caller is mid-publish and will store the
  // even one shortly, which the spin below catches.
  while (epoch_.load(std::memory_order_seq_cst) == seen && !stop_.load(std::memory_order_relaxed))
    wake_.wait(lock);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  lock.unlock();
  for (;;) {
    const uint64_t e = epoch_.load(std::memory_order_acquire);
    if ((e != seen && (e & 1) == 0) || stop_.load(std::memory_order_relaxed)) return e;
    cpu_relax();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const uint64_t e = wait_for_job(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    // Seqlock read: the fields are valid only if the epoch did not move.
    const Task task = task_.load(std::memory_order_relaxed);
    void* const ctx = ctx_.load(std::memory_order_relaxed);
    const size_t n = n_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (epoch_.load(std::memory_order_relaxed) != e) continue;  // a newer job: read again
    seen = e;
    in_task_ = true;
    const size_t ran = drain(generation_of(e), n, task, ctx);
    in_task_ = false;
    if (ran > 0) done_.fetch_add(ran, std::memory_order_release);
  }
}

}  // namespace edgellm
