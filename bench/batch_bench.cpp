// Where a batched decode step's time goes (not a test): one model, B contexts
// each prefilled with its own prompt, then alternating rounds of B single
// decode steps (one context at a time, decode_step) and one decode_batch of
// all B, with the profiler on. Prints the median per-token cost of each and
// the per-zone breakdown (ms per step), so a batched step's extra cost is
// attributed to projections, attention, the LM head or the rest.
//
//   batch_bench --model DIR [--batch 8] [--steps 16] [--rounds 5] [--threads 2] [--pos 64]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/session.h"
#include "kernels/kernels.h"

using namespace edgellm;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model;
  int batch = 8, steps = 16, rounds = 5, threads = 2, pos = 64;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw Error(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--batch")
      a.batch = std::atoi(v);
    else if (k == "--steps")
      a.steps = std::atoi(v);
    else if (k == "--rounds")
      a.rounds = std::atoi(v);
    else if (k == "--threads")
      a.threads = std::atoi(v);
    else if (k == "--pos")
      a.pos = std::atoi(v);
    else
      throw Error("unknown option " + k);
  }
  check(!a.model.empty(), "--model DIR is required");
  check(a.batch >= 1 && a.steps >= 1 && a.rounds >= 1 && a.pos >= 1, "counts must be >= 1");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr Zone kZones[] = {Zone::qkv_proj,   Zone::attention, Zone::o_proj, Zone::gate_up_proj,
                           Zone::down_proj,  Zone::lm_head,   Zone::norm,   Zone::rope,
                           Zone::activation, Zone::residual,  Zone::embed};

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  Session session;
  SessionOptions so;
  so.threads = a.threads;
  so.max_context = a.pos + (a.steps + 1) * a.rounds * 2 + 8;
  so.profile = true;
  session.setup(a.model, so);
  Profiler& prof = session.profiler();
  std::vector<Context> contexts;
  std::vector<Context*> ptrs;
  std::vector<int32_t> tokens;
  std::vector<int> positions;
  for (int b = 0; b < a.batch; ++b) {
    contexts.emplace_back(session.model());
  }
  for (int b = 0; b < a.batch; ++b) {
    std::vector<int32_t> prompt(static_cast<size_t>(a.pos));
    for (int i = 0; i < a.pos; ++i)
      prompt[static_cast<size_t>(i)] = (17 * i + 31 * b + 5) % 1000 + 10;
    contexts[static_cast<size_t>(b)].prefill(prompt);
    ptrs.push_back(&contexts[static_cast<size_t>(b)]);
    tokens.push_back(100 + b);
    positions.push_back(a.pos);
  }
  const size_t nz = std::size(kZones);
  std::vector<std::vector<double>> single_zone(nz), batch_zone(nz);
  std::vector<double> single_ms, batch_ms;
  for (int r = 0; r < a.rounds; ++r) {
    // B sequences one at a time...
    prof.reset();
    auto t0 = Clock::now();
    for (int s = 0; s < a.steps; ++s)
      for (int b = 0; b < a.batch; ++b) {
        Context& c = contexts[static_cast<size_t>(b)];
        c.decode_step(tokens[static_cast<size_t>(b)], positions[static_cast<size_t>(b)]++);
      }
    single_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
                        (a.steps * a.batch));
    for (size_t z = 0; z < nz; ++z)
      single_zone[z].push_back(prof.stats(kZones[z], Phase::decode).seconds * 1e3 /
                               (a.steps * a.batch));
    // ... and the same B in one batched step each.
    prof.reset();
    t0 = Clock::now();
    for (int s = 0; s < a.steps; ++s) {
      decode_batch(ptrs, tokens, positions);
      for (int& p : positions) ++p;
    }
    batch_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() /
                       a.steps);
    for (size_t z = 0; z < nz; ++z)
      batch_zone[z].push_back(prof.stats(kZones[z], Phase::decode).seconds * 1e3 / a.steps);
  }
  const double s1 = median(single_ms), sb = median(batch_ms);
  std::printf("%s, %d threads, isa %s, batch %d, positions %d..%d, medians of %d rounds\n",
              a.model.c_str(), session.threads(),
              std::string(kernels::isa_name(kernels::active_isa())).c_str(), a.batch, a.pos,
              positions[0], a.rounds);
  std::printf("single decode_step: %.2f ms/token (%.1f tok/s)\n", s1, 1e3 / s1);
  std::printf("decode_batch(%d):   %.2f ms/step = %.2f ms/token (%.1f tok/s) -> %.2fx\n", a.batch,
              sb, sb / a.batch, 1e3 * a.batch / sb, s1 * a.batch / sb);
  std::printf("%-14s %10s %10s %7s\n", "zone", "single ms", "batch ms", "ratio");
  for (size_t z = 0; z < nz; ++z) {
    const double x = median(single_zone[z]), y = median(batch_zone[z]);
    std::printf("%-14s %10.3f %10.3f %7.2f\n", std::string(zone_name(kZones[z])).c_str(), x, y,
                x > 0 ? y / x : 0.0);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
