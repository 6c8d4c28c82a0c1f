// The server's continuous-batching Scheduler in the Python binding, so that a
// Python host (the Ray Serve replica) batches requests with the
// same C++ loop as edgellm_server instead of re-implementing it in Python.
#include "serving.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>

#include "edgellm/metrics.h"
#include "edgellm/reasoning.h"
#include "edgellm/scheduler.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The Scheduler borrows its Metrics: both live (and die) together here.
struct BatchScheduler {
  edgellm::Metrics metrics;
  std::unique_ptr<edgellm::Scheduler> scheduler;

  BatchScheduler(const edgellm::Model& model, int max_batch, int max_queue, int prefill_chunk,
                 size_t cache_mb, bool lookup) {
    edgellm::SchedulerOptions o;
    o.max_batch = max_batch;
    o.max_queue = max_queue;
    o.prefill_chunk = prefill_chunk;
    o.cache_mb = cache_mb;
    o.lookup = lookup;
    scheduler = std::make_unique<edgellm::Scheduler>(model, o, metrics);
  }
  ~BatchScheduler() {
    nb::gil_scoped_release release;  // the join may wait for a running step
    scheduler.reset();
  }
};

}  // namespace

void bind_serving(nb::module_& m) {
  using edgellm::RequestStream;
  nb::class_<RequestStream>(m, "RequestStream",
                            "One request on a Scheduler: its text as it comes and its outcome.")
      .def(
          "wait",
          [](RequestStream& s, int timeout_ms) {
            std::string text;
            bool done;
            std::vector<edgellm::TokenLogprobs> lp;
            {
              nb::gil_scoped_release release;
              done = s.wait(text, std::chrono::milliseconds(timeout_ms), &lp);
            }
            // (token, logprob, [(token, logprob), ...]) per new output token.
            std::vector<std::tuple<int32_t, float, std::vector<std::pair<int32_t, float>>>> out;
            for (const edgellm::TokenLogprobs& l : lp) {
              std::vector<std::pair<int32_t, float>> top;
              for (const edgellm::TokenLogprob& t : l.top) top.emplace_back(t.token, t.logprob);
              out.emplace_back(l.chosen.token, l.chosen.logprob, std::move(top));
            }
            return std::make_tuple(nb::bytes(text.data(), text.size()), done, std::move(out));
          },
          "timeout_ms"_a,
          "Waits up to timeout_ms for news: (new text as UTF-8 bytes, finished, logprobs). Bytes, "
          "because a piece may end inside a character. logprobs (submitted with logprobs >= 0): "
          "(token, logprob, [(token, logprob), ...]) of each new output token, which may come "
          "before its text.")
      .def("cancel", &RequestStream::cancel, "Stops the request before its next token.")
      .def_prop_ro(
          "finish_reason",
          [](const RequestStream& s) { return std::string(edgellm::finish_reason_name(s.finish)); })
      .def_prop_ro("error", [](const RequestStream& s) { return s.error; })
      .def_prop_ro(
          "stop_string", [](const RequestStream& s) { return s.stop_string; },
          "The stop string that ended the text, if one did (else empty).")
      .def_prop_ro("prompt_tokens", [](const RequestStream& s) { return s.prompt_tokens; })
      .def_prop_ro("completion_tokens", [](const RequestStream& s) { return s.completion_tokens; })
      .def_prop_ro(
          "cached_tokens", [](const RequestStream& s) { return s.cached_tokens; },
          "Prompt tokens whose KV came from the prefix cache instead of a prefill.");

  m.def(
      "chat_reasoning",
      [](const edgellm::Model& model, const std::vector<int32_t>& prompt, bool forced_call,
         int budget) {
        const edgellm::GenerateOptions::Reasoning r = edgellm::chat_reasoning(
            model.tokenizer(), model.chat_template(), prompt, forced_call, budget);
        return PyReasoning(r.enabled, r.started, r.budget, r.harmony);
      },
      "model"_a, "prompt"_a, "forced_call"_a, "budget"_a = -1,
      "A chat reply's reasoning rules (edgellm/reasoning.h), (enabled, started, budget, "
      "harmony): on for a template with <think> blocks or harmony's channels, except for a "
      "forced tool call. ReplySplitter(rules) reads the reply's text by them.");

  nb::class_<BatchScheduler>(m, "Scheduler",
                             "edgellm_server's continuous batching over one Model: requests join "
                             "and leave between steps, one batched decode step per iteration.")
      .def(nb::init<const edgellm::Model&, int, int, int, size_t, bool>(), "model"_a,
           "max_batch"_a = 8, "max_queue"_a = 64, "prefill_chunk"_a = 256,
           "cache_mb"_a = edgellm::SchedulerOptions{}.cache_mb, "lookup"_a = true,
           nb::keep_alive<1, 2>(),
           "cache_mb: the prefix cache's MiB of prompt KV reused by later requests (0 = off). "
           "lookup: prompt-lookup decoding for a greedy request that decodes alone.")
      .def(
          "submit",
          [](BatchScheduler& b, std::vector<int32_t> prompt, int max_tokens, float temperature,
             int top_k, float top_p, uint64_t seed, std::vector<std::string> stop, bool stop_at_eos,
             float min_p, float frequency_penalty, float presence_penalty, int logprobs,
             const PyGrammar* grammar, std::optional<PyReasoning> reasoning) {
            edgellm::GenerateOptions o;
            o.max_tokens = max_tokens;
            o.sampling = {temperature,       top_k,           top_p, seed, min_p,
                          frequency_penalty, presence_penalty};
            o.stop_strings = std::move(stop);
            o.stop_at_eos = stop_at_eos;
            o.logprobs = logprobs;
            if (grammar) o.grammar = grammar->grammar;
            o.reasoning = reasoning_of(reasoning);
            return b.scheduler->submit(std::move(prompt), std::move(o));
          },
          "prompt"_a, "max_tokens"_a, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f,
          "seed"_a = 0, "stop"_a = std::vector<std::string>{}, "stop_at_eos"_a = true,
          "min_p"_a = 0.0f, "frequency_penalty"_a = 0.0f, "presence_penalty"_a = 0.0f,
          "logprobs"_a = -1, "grammar"_a = nanobind::none(), "reasoning"_a = nanobind::none(),
          "Queues a request; None when the queue is full or the scheduler is stopping. grammar: "
          "compile_response_format()'s structured output. reasoning: chat_reasoning()'s "
          "(enabled, started, budget).")
      .def_prop_ro("stopping", [](const BatchScheduler& b) { return b.scheduler->stopping(); })
      .def(
          "load",
          [](const BatchScheduler& b) {
            const edgellm::Metrics::Snapshot s = b.metrics.load();
            return std::make_tuple(s.active, s.waiting);
          },
          "(active, waiting) requests now.")
      .def(
          "metrics", [](const BatchScheduler& b) { return b.metrics.render(); },
          "The scheduler's Prometheus text (tokens, cached tokens, prefix cache, queue, TTFT, "
          "inter-token latency).")
      .def(
          "shutdown",
          [](BatchScheduler& b, int drain_ms) {
            nb::gil_scoped_release release;
            b.scheduler->shutdown(std::chrono::milliseconds(drain_ms));
          },
          "drain_ms"_a = 0,
          "Refuses new requests, lets running ones finish for drain_ms, cancels the rest.");
}
