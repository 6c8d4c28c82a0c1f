#include "edgellm/scheduler.h"

#include <algorithm>

#include "edgellm/error.h"

namespace edgellm {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr size_t kMinChunk = kMinPrefillChunk;
}  // namespace

bool RequestStream::wait(std::string& text, std::chrono::milliseconds timeout,
                         std::vector<TokenLogprobs>* logprobs) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !text_.empty() || !logprobs_.empty() || done_; });
  text += text_;
  text_.clear();
  if (logprobs) logprobs->insert(logprobs->end(), logprobs_.begin(), logprobs_.end());
  logprobs_.clear();
  return done_;
}

void RequestStream::push(const std::string& text, bool done,
                         const std::optional<TokenLogprobs>& logprobs) {
  {
    const std::lock_guard lock(mutex_);
    text_ += text;
    if (logprobs) logprobs_.push_back(*logprobs);
    done_ = done_ || done;
  }
  cv_.notify_all();
}

struct Scheduler::Job {
  std::vector<int32_t> prompt;
  GenerateOptions options;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<Context> context;  // its slot's; its position() is the next decode step's
  int slot = -1;
  std::optional<Generation> gen;
  size_t prefilled = 0;
  bool looked_up = false;     // the prefix cache was asked (at the first prefill turn)
  PrefixCache::Chain cached;  // held from the lookup until the prompt's blocks are stored
  int32_t last_token = -1;
  PromptLookup lookup;
  Clock::time_point submitted = Clock::now(), last_token_at;

  bool prefilling() const { return prefilled < prompt.size(); }
};

Scheduler::Scheduler(const Model& model, const SchedulerOptions& options, Metrics& metrics)
    : model_(model), options_(options), metrics_(metrics) {
  check(options.max_batch >= 1, "--parallel must be >= 1");
  check(options.max_queue >= 0, "--queue must be >= 0");
  check(options.prefill_chunk >= 1, "--prefill-chunk must be >= 1");
  if (options.cache_mb > 0) cache_ = std::make_unique<PrefixCache>(model, options.cache_mb << 20);
  slots_.resize(static_cast<size_t>(options.max_batch));
  // Now, not inside the scheduler thread on the first constrained request,
  // where building it would stall every stream decoding beside it.
  warm_grammar_index(model.tokenizer());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  if (thread_.joinable()) shutdown(std::chrono::milliseconds(0));
}

std::shared_ptr<RequestStream> Scheduler::submit(std::vector<int32_t> prompt,
                                                 GenerateOptions options) {
  auto job = std::make_unique<Job>();
  job->stream = std::make_shared<RequestStream>();
  job->prompt = std::move(prompt);
  job->options = std::move(options);
  job->options.cancel = &job->stream->cancelled_;
  job->stream->prompt_tokens = job->prompt.size();
  auto stream = job->stream;
  {
    const std::lock_guard lock(mutex_);
    const size_t free_slots = static_cast<size_t>(options_.max_batch) - active_count_;
    if (stopping_ || waiting_.size() >= static_cast<size_t>(options_.max_queue) + free_slots)
      return nullptr;
    waiting_.push_back(std::move(job));
    metrics_.set_queue(waiting_.size(), active_count_);
  }
  cv_.notify_one();
  return stream;
}

void Scheduler::shutdown(std::chrono::milliseconds drain) {
  stopping_ = true;
  cv_.notify_one();
  const auto deadline = Clock::now() + drain;
  while (!exited_ && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  cancel_all_ = true;
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::loop() {
  for (;;) {
    std::deque<std::packaged_task<void()>> tasks;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] {
        return !waiting_.empty() || !active_.empty() || !tasks_.empty() || stopping_;
      });
      if (cancel_all_)
        for (auto& job : waiting_) job->stream->cancel();
      // A task queued before stopping_ still runs (run_between_steps refuses later ones).
      if (stopping_ && waiting_.empty() && active_.empty() && tasks_.empty()) break;
      admit();
      active_count_ = active_.size();
      metrics_.set_queue(waiting_.size(), active_count_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();  // its exception goes to the caller's future
    if (cancel_all_)
      for (auto& job : active_) job->stream->cancel();
    prefill_some();
    decode_all();
    retire_finished();
  }
  {
    const std::lock_guard lock(mutex_);
    active_count_ = 0;
    metrics_.set_queue(waiting_.size(), 0);
  }
  exited_ = true;
}

// Under mutex_: moves waiting requests into free slots.
void Scheduler::admit() {
  while (!waiting_.empty() && active_.size() < static_cast<size_t>(options_.max_batch)) {
    std::unique_ptr<Job> job = std::move(waiting_.front());
    waiting_.pop_front();
    try {
      job->gen.emplace(model_.tokenizer(), model_.config(), job->options);
      if (job->stream->cancelled_) {
        publish(*job, job->gen->finish(FinishReason::cancelled));
        continue;
      }
      // The lowest free slot: requests one after another all run in slot 0.
      const auto slot = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) {
        return !s.busy;
      });  // one is free: fewer jobs than slots are active
      if (!slot->context) slot->context = std::make_unique<Context>(model_);
      slot->prompt = job->prompt;
      slot->busy = true;
      job->context = std::move(slot->context);
      job->slot = static_cast<int>(slot - slots_.begin());
      job->stream->slot = job->slot;
      active_.push_back(std::move(job));
    } catch (const std::exception& e) {
      fail(*job, e.what());
    }
  }
}

void Scheduler::fail(Job& job, const std::string& message) {
  job.stream->error = message;
  job.stream->finish = FinishReason::cancelled;
  job.stream->push("", true, std::nullopt);
  if (job.gen && !job.gen->done()) job.gen->finish(FinishReason::cancelled);
}

// Loads the KV of the prompt's longest cached prefix, in whole blocks, leaving
// at least kMinChunk tokens to prefill (the last one's logits are needed).
void Scheduler::reuse_cached_prefix(Job& job) {
  job.looked_up = true;
  if (!cache_) return;
  job.cached = cache_->match(job.prompt);
  const size_t block = cache_->block_tokens();
  const size_t limit = job.prompt.size() > kMinChunk ? job.prompt.size() - kMinChunk : 0;
  const size_t reuse = std::min(job.cached.tokens(), limit / block * block);
  if (reuse == 0) return;
  cache_->load(job.cached, reuse, *job.context);
  job.prefilled = reuse;
  job.stream->cached_tokens = reuse;
  metrics_.add_cached_tokens(reuse);
}

// Up to prefill_chunk prompt tokens (prefill_chunk_size) between two decode steps, oldest request
// first: a long prompt is cut into chunks (the streams already decoding never
// wait for more than one chunk), while short prompts that arrive together are
// all prefilled before the next step, so they join the batch at once instead of
// one per step (each partial step reads all the weights for fewer tokens).
// A request whose prompt is done samples its first token.
void Scheduler::prefill_some() {
  size_t budget = static_cast<size_t>(options_.prefill_chunk);
  for (auto& job : active_) {
    if (budget == 0) return;
    if (!job->prefilling() || job->gen->done()) continue;
    if (job->stream->cancelled_) {
      publish(*job, job->gen->finish(FinishReason::cancelled));
      continue;
    }
    try {
      if (!job->looked_up) reuse_cached_prefix(*job);
      const size_t n = prefill_chunk_size(job->prompt.size() - job->prefilled, budget);
      const std::span<const int32_t> chunk(job->prompt.data() + job->prefilled, n);
      const std::span<const float> logits =
          job->context->prefill(chunk, static_cast<int>(job->prefilled));
      job->prefilled += n;
      budget -= std::min(n, budget);
      if (!job->prefilling()) {
        const Generation::Step step = job->gen->next(logits);
        metrics_.observe_ttft(seconds_since(job->submitted));
        publish(*job, step);
        if (cache_) {  // after the first token, which need not wait for the copies
          cache_->store(job->cached, job->prompt, *job->context);
          job->cached.release();
          metrics_.set_prefix_cache(cache_->blocks(), cache_->bytes(), cache_->evictions());
        }
      }
    } catch (const std::exception& e) {
      fail(*job, e.what());
    }
  }
}

// One decode step for every sequence past its prefill, in one batch.
void Scheduler::decode_all() {
  std::vector<Job*> batch;
  std::vector<Context*> contexts;
  std::vector<int32_t> tokens;
  std::vector<int> positions;
  for (auto& job : active_) {
    if (job->prefilling() || job->gen->done()) continue;
    if (job->stream->cancelled_) {
      publish(*job, job->gen->finish(FinishReason::cancelled));
    } else if (job->context->position() >= job->context->max_context()) {
      publish(*job, job->gen->finish(FinishReason::length));
    } else {
      batch.push_back(job.get());
      contexts.push_back(job->context.get());
      tokens.push_back(job->last_token);
      positions.push_back(job->context->position());
    }
  }
  if (batch.empty()) return;
  if (batch.size() == 1 && options_.lookup && PromptLookup::eligible(batch[0]->options)) {
    decode_alone(*batch[0]);
    return;
  }
  try {
    decode_batch(contexts, tokens, positions);
  } catch (const std::exception& e) {
    for (Job* job : batch) fail(*job, e.what());
    return;
  }
  for (Job* job : batch) publish(*job, job->gen->next(job->context->logits()));
}

// A greedy sequence decoding alone: a prompt-lookup draft verified in one
// forward when the context offers one, else one plain decode step.
void Scheduler::decode_alone(Job& job) {
  const int room =
      std::min(job.context->max_context() - job.context->position() - 1,
               job.options.max_tokens - static_cast<int>(job.gen->tokens().size()) - 1);
  try {
    const std::vector<int32_t> draft = job.lookup.draft(job.prompt, job.gen->tokens(), room);
    if (draft.empty()) {
      const auto start = Clock::now();
      const std::span<const float> logits =
          job.context->decode_step(job.last_token, job.context->position());
      job.lookup.plain_step(seconds_since(start) * 1e3);
      publish(job, job.gen->next(logits));
      return;
    }
    const std::vector<Generation::Step> steps =
        job.lookup.verify(*job.context, *job.gen, job.last_token, draft);
    metrics_.add_lookup(draft.size(), steps.size() - 1);
    for (const Generation::Step& step : steps) publish(job, step);
  } catch (const std::exception& e) {
    fail(job, e.what());
  }
}

void Scheduler::publish(Job& job, const Generation::Step& step) {
  const auto now = Clock::now();
  if (step.token >= 0) {
    if (job.last_token >= 0)
      metrics_.observe_token_latency(
          std::chrono::duration<double>(now - job.last_token_at).count());
    job.last_token = step.token;
    job.last_token_at = now;
  }
  if (step.done) {
    job.stream->finish = job.gen->finish_reason();
    job.stream->stop_string = job.gen->stop_string();
    job.stream->completion_tokens = job.gen->tokens().size();
    metrics_.add_tokens(job.prefilled, job.gen->tokens().size());
  }
  if (!step.text.empty() || step.done || step.logprobs)
    job.stream->push(step.text, step.done, step.logprobs);
}

void Scheduler::retire_finished() {
  for (auto& job : active_) {
    if (!job->gen->done() && job->stream->error.empty()) continue;
    Slot& slot = slots_[static_cast<size_t>(job->slot)];
    slot.context = std::move(job->context);
    slot.busy = false;
    job.reset();
  }
  std::erase(active_, nullptr);
  const std::lock_guard lock(mutex_);
  active_count_ = active_.size();
  metrics_.set_queue(waiting_.size(), active_count_);
}

void Scheduler::run_between_steps(std::function<void()> task) {
  std::packaged_task<void()> queued(std::move(task));
  std::future<void> done = queued.get_future();
  {
    const std::lock_guard lock(mutex_);
    if (stopping_) throw Error("the server is shutting down");
    tasks_.push_back(std::move(queued));
  }
  cv_.notify_one();
  done.get();
}

void Scheduler::check_slot(int slot) const {
  check(slot >= 0 && slot < options_.max_batch,
        "no slot " + std::to_string(slot) + ": slots are 0 to " +
            std::to_string(options_.max_batch - 1) + " (--parallel " +
            std::to_string(options_.max_batch) + ")");
  check(cache_ != nullptr, "the prefix cache is off (--cache-mb 0): no blocks to save or restore");
}

// Computed with a free slot's context (its KV is overwritten by its next
// request anyway), or a passing one when every slot is busy.
const KvFingerprint& Scheduler::fingerprint() {
  if (fingerprint_) return *fingerprint_;
  const auto slot =
      std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.busy; });
  if (slot == slots_.end()) {
    Context probe(model_);
    fingerprint_ = kv_fingerprint(model_, *cache_, probe);
  } else {
    if (!slot->context) slot->context = std::make_unique<Context>(model_);
    fingerprint_ = kv_fingerprint(model_, *cache_, *slot->context);
  }
  return *fingerprint_;
}

Scheduler::SlotFile Scheduler::save_slot(int slot, const std::filesystem::path& dir,
                                         const std::string& name) {
  check_slot(slot);
  const std::lock_guard one_file(slot_file_mutex_);
  const auto start = Clock::now();
  KvFingerprint fp;
  PrefixBlocks blocks;
  run_between_steps([&] {
    const std::vector<int32_t>& prompt = slots_[static_cast<size_t>(slot)].prompt;
    const PrefixCache::Chain chain = cache_->match(prompt);
    check(chain.size() > 0,
          prompt.empty() ? "slot " + std::to_string(slot) +
                               " has no prompt to save: it has served no request (or was erased)"
                         : "slot " + std::to_string(slot) + "'s last prompt (" +
                               std::to_string(prompt.size()) +
                               " tokens) has no whole block in the prefix cache");
    fp = fingerprint();
    blocks = copy_prefix_blocks(*cache_, chain, prompt);
  });
  SlotFile out;
  out.bytes = save_prefix_file(dir, name, fp, blocks);
  out.tokens = blocks.tokens.size();
  out.ms = seconds_since(start) * 1e3;
  return out;
}

Scheduler::SlotFile Scheduler::restore_slot(int slot, const std::filesystem::path& dir,
                                            const std::string& name) {
  check_slot(slot);
  const std::lock_guard one_file(slot_file_mutex_);
  const auto start = Clock::now();
  KvFingerprint fp;
  run_between_steps([&] { fp = fingerprint(); });
  LoadedPrefix loaded = load_prefix_file(dir, name, fp);
  SlotFile out;
  out.tokens = loaded.blocks.tokens.size();
  out.bytes = loaded.bytes;
  run_between_steps([&] {
    out.cached_tokens = cache_prefix_blocks(loaded.blocks, *cache_);
    slots_[static_cast<size_t>(slot)].prompt = std::move(loaded.blocks.tokens);
    metrics_.set_prefix_cache(cache_->blocks(), cache_->bytes(), cache_->evictions());
  });
  out.ms = seconds_since(start) * 1e3;
  return out;
}

size_t Scheduler::erase_slot(int slot) {
  check_slot(slot);
  size_t n = 0;
  run_between_steps([&] {
    std::vector<int32_t>& prompt = slots_[static_cast<size_t>(slot)].prompt;
    n = prompt.size();
    prompt.clear();
  });
  return n;
}

}  // namespace edgellm
