// Continuous batching over one Model: requests join and leave between steps.
// The serving core below every front end: `edgellm serve`, the Python binding
// and the Ray Serve replicas.
//
// One scheduler thread owns every Context. Each iteration it (1) admits
// waiting requests into free sequence slots, (2) prefills at most
// `prefill_chunk` prompt tokens, oldest request first (several short prompts
// at once, a long one in chunks), so a long prompt never freezes the streams
// already decoding, and (3) runs one
// batched decode step (decode_batch) for every request that is decoding. The
// per-token rules (sampling, stops, max tokens, streamed text) are the engine's
// Generation, the same as generate().
//
// With a prefix cache (--cache-mb), a prompt whose first blocks were already
// computed, by any earlier request, loads their KV instead of prefilling them
// (edgellm/prefix_cache.h); its own whole blocks are stored once its prefill
// is done. Every prefill chunk is at least kMinPrefillChunk tokens, so each
// prompt row is computed by the same kernels whatever the chunking or cache
// hit: outputs are bit-identical with and without the cache.
//
// Each Context is a numbered sequence slot (0 .. max_batch - 1; a request takes
// the lowest free one) that remembers the prompt of the last request it
// served. save_slot() writes that prompt's cached blocks to a file and
// restore_slot() reads such a file back into the cache (prefix_cache_file.h),
// so a long system prompt survives a restart. The cache and the contexts are
// the scheduler thread's alone, and a file may be slow: the blocks are copied
// out of, or into, the cache on the scheduler thread between two steps (queued
// tasks the caller waits for, memory only), and the file is written or read
// on the caller's thread, so no file ever delays a step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "edgellm/generate.h"
#include "edgellm/metrics.h"
#include "edgellm/prefix_cache.h"
#include "edgellm/prefix_cache_file.h"
#include "edgellm/session.h"

namespace edgellm {

// What the scheduler hands back to the HTTP thread of one request.
class RequestStream {
 public:
  // Waits up to `timeout` for news; moves new text into `text`. Returns true
  // once the request is finished (then finish/error/usage are final).
  // With GenerateOptions::logprobs >= 0, `logprobs` (when given) receives those
  // of the new tokens; they may come before their text (held back for a stop string).
  bool wait(std::string& text, std::chrono::milliseconds timeout,
            std::vector<TokenLogprobs>* logprobs = nullptr);
  void cancel() { cancelled_.store(true); }

  FinishReason finish = FinishReason::none;
  std::string error;        // set when the engine failed the request
  std::string stop_string;  // the stop string that ended it (FinishReason::stop); else empty
  size_t prompt_tokens = 0, completion_tokens = 0;
  size_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int slot = -1;             // the sequence slot that served it (set when admitted)

 private:
  friend class Scheduler;
  void push(const std::string& text, bool done, const std::optional<TokenLogprobs>& logprobs);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::string text_;
  std::vector<TokenLogprobs> logprobs_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int max_batch = 8;        // sequences decoding at once (contexts allocated lazily)
  int max_queue = 64;       // waiting requests beyond that are refused (HTTP 429)
  int prefill_chunk = 256;  // prompt tokens prefilled between two decode steps
  size_t cache_mb = 256;    // prefix cache budget in MiB of KV (0 = off)
  // Prompt-lookup decoding for a greedy request that decodes alone (PromptLookup).
  bool lookup = true;
};

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options, Metrics& metrics);
  ~Scheduler();

  // Queues a request, or returns nullptr when the queue is full or the server
  // is stopping (see stopping()).
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, GenerateOptions options);
  bool stopping() const { return stopping_.load(); }

  int slots() const { return options_.max_batch; }
  struct SlotFile {
    size_t tokens = 0;         // the prompt tokens the file's blocks cover
    size_t cached_tokens = 0;  // restore: of those, now in the cache (fewer once it is full)
    size_t bytes = 0;          // the file's size
    double ms = 0;             // the whole action, the file's I/O included
  };
  // The cached blocks of the last prompt `slot` served, written to the file
  // `name` in the folder `dir` (atomically, never outside it). Error when the
  // slot is out of range, the cache is off, none of that prompt is cached, or
  // the file cannot be written.
  SlotFile save_slot(int slot, const std::filesystem::path& dir, const std::string& name);
  // The file `name` in `dir`, which save_slot wrote (by this model and
  // arithmetic), into the cache; its prompt becomes the slot's last. Error when
  // it is missing, not a regular file, short, corrupt, another model's or
  // holds ids outside the vocabulary (then nothing is cached).
  SlotFile restore_slot(int slot, const std::filesystem::path& dir, const std::string& name);
  // The slot forgets its last prompt (its blocks stay cached until evicted);
  // returns that prompt's length.
  size_t erase_slot(int slot);

  // Stops taking requests; lets the admitted and queued ones finish for up to
  // `drain`, then cancels what is left, and joins the thread.
  void shutdown(std::chrono::milliseconds drain);

 private:
  struct Job;
  struct Slot {
    std::unique_ptr<Context> context;  // allocated at its first request; null while a Job has it
    bool busy = false;
    std::vector<int32_t> prompt;  // of the last request it served
  };
  void loop();
  // Runs `task` on the scheduler thread before its next step and waits for
  // it; rethrows what it threw. Error once the scheduler is stopping.
  void run_between_steps(std::function<void()> task);
  void check_slot(int slot) const;
  const KvFingerprint& fingerprint();
  void admit();
  void fail(Job& job, const std::string& message);
  void reuse_cached_prefix(Job& job);
  void prefill_some();
  void decode_all();
  void decode_alone(Job& job);
  void retire_finished();
  void publish(Job& job, const Generation::Step& step);

  const Model& model_;
  SchedulerOptions options_;
  Metrics& metrics_;
  // Before the jobs, which hold its blocks: destroyed after them.
  std::unique_ptr<PrefixCache> cache_;  // scheduler thread only; null when off
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> waiting_;      // guarded by mutex_
  std::deque<std::packaged_task<void()>> tasks_;  // guarded by mutex_
  size_t active_count_ = 0;                       // guarded by mutex_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<bool> exited_{false};
  // Scheduler thread only:
  std::vector<std::unique_ptr<Job>> active_;
  std::vector<Slot> slots_;                   // max_batch of them
  std::optional<KvFingerprint> fingerprint_;  // of the cache's blocks, at the first slot file
  // One slot file at a time: its blocks' copy in memory is at most one
  // context's KV, however many clients save or restore at once.
  std::mutex slot_file_mutex_;
  std::thread thread_;
};

}  // namespace edgellm
