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
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "edgellm/generate.h"
#include "edgellm/metrics.h"
#include "edgellm/prefix_cache.h"
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

  // Stops taking requests; lets the admitted and queued ones finish for up to
  // `drain`, then cancels what is left, and joins the thread.
  void shutdown(std::chrono::milliseconds drain);

 private:
  struct Job;
  void loop();
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
  std::deque<std::unique_ptr<Job>> waiting_;  // guarded by mutex_
  size_t active_count_ = 0;                   // guarded by mutex_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<bool> exited_{false};
  // Scheduler thread only:
  std::vector<std::unique_ptr<Job>> active_;
  std::vector<std::unique_ptr<Context>> free_contexts_;
  std::thread thread_;
};

}  // namespace edgellm
