#include "profile_report.h"

#include <cstdio>
#include <string>

#include "edgellm/roofline.h"

namespace edgellm {

namespace {

void print_kernels(const Profiler& p, Phase phase, const char* title, double phase_ms,
                   const Roofline& roof) {
  std::fprintf(stderr, "\n== kernels: %s (%.1f ms) ==\n", title, phase_ms);
  std::fprintf(stderr, "%-14s %9s %7s %7s %9s %7s %9s %7s\n", "kernel", "ms", "share", "calls",
               "GB/s", "of BW", "GFLOP/s", "of peak");
  double covered = 0;
  for (int z = 0; z < static_cast<int>(Zone::count); ++z) {
    const Zone zone = static_cast<Zone>(z);
    if (is_phase(zone)) continue;
    const ZoneStats& s = p.stats(zone, phase);
    if (s.calls == 0) continue;
    const double ms = s.seconds * 1e3;
    covered += ms;
    const double gbs = s.seconds > 0 ? s.bytes / s.seconds / 1e9 : 0.0;
    const double gflops = s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0;
    std::fprintf(stderr, "%-14s %9.2f %6.1f%% %7llu %9.2f %6.0f%% %9.2f %6.0f%%\n",
                 std::string(zone_name(zone)).c_str(), ms,
                 phase_ms > 0 ? 100.0 * ms / phase_ms : 0.0,
                 static_cast<unsigned long long>(s.calls), gbs,
                 roof.read_gb_per_s > 0 ? 100.0 * gbs / roof.read_gb_per_s : 0.0, gflops,
                 roof.fma_gflop_per_s > 0 ? 100.0 * gflops / roof.fma_gflop_per_s : 0.0);
  }
  std::fprintf(stderr, "%-14s %9.2f %6.1f%%   (thread-pool waits, scratch copies, sampling)\n",
               "(unattributed)", phase_ms - covered,
               phase_ms > 0 ? 100.0 * (phase_ms - covered) / phase_ms : 0.0);
}

}  // namespace

void print_profile(Session& session, size_t prompt_tokens, int decode_steps) {
  const Profiler& p = session.profiler();
  const double prefill_ms = p.stats(Zone::prefill).seconds * 1e3;
  const double decode_ms = p.stats(Zone::decode).seconds * 1e3;
  std::fprintf(stderr,
               "\n(measuring the roofline: read bandwidth and matmul peak, %d threads...)\n",
               session.threads());
  const Roofline roof = measure_roofline(session.threads(), session.exec_config());
  const double weight_gb = session.weight_bytes() / 1e9;
  const double roof_tps = roof.read_gb_per_s / weight_gb;
  const double tps = decode_steps > 0 ? decode_steps * 1000.0 / decode_ms : 0.0;

  std::fprintf(stderr, "\n== phases ==\n");
  std::fprintf(stderr, "setup                  %10.1f ms\n", p.stats(Zone::setup).seconds * 1e3);
  std::fprintf(stderr, "prefill total          %10.1f ms  (%zu tokens)\n", prefill_ms,
               prompt_tokens);
  std::fprintf(stderr, "decode avg per token   %10.2f ms  (%d steps, %.2f tokens/s)\n",
               decode_steps ? decode_ms / decode_steps : 0.0, decode_steps, tps);
  const ZoneStats& head = p.stats(Zone::lm_head, Phase::decode);
  std::fprintf(stderr, "LM head avg per token  %10.2f ms\n",
               head.calls ? head.seconds * 1e3 / head.calls : 0.0);
  std::fprintf(stderr, "\n== roofline (measured now) ==\n");
  std::fprintf(
      stderr,
      "read bandwidth %.1f GB/s, matmul peak %.1f GFLOP/s (%s tier); decode streams %.1f MB of "
      "weights per token\n",
      roof.read_gb_per_s, roof.fma_gflop_per_s, std::string(roof.peak_tier).c_str(),
      weight_gb * 1e3);
  std::fprintf(stderr, "arithmetic %s (--exact / --kv-cache / EDGELLM_*)\n",
               describe_exec_config(session.exec_config()).c_str());
  std::fprintf(stderr, "KV cache %s, %.1f MB for %d positions (--kv-cache / EDGELLM_KV_CACHE)\n",
               session.kv_cache_dtype().c_str(), session.kv_cache_bytes() / 1e6,
               session.max_context());
  if (roof.passes > 1)
    std::fprintf(stderr,
                 "prefill GEMM issues %.0f tile passes per useful flop (x split into bf16 parts): "
                 "its ceiling is %.0f%% of that peak\n",
                 roof.passes, 100.0 / roof.passes);
  std::fprintf(stderr, "decode roofline %.1f tokens/s -> achieved %.0f%%\n", roof_tps,
               roof_tps > 0 ? 100.0 * tps / roof_tps : 0.0);

  print_kernels(p, Phase::prefill, "prefill", prefill_ms, roof);
  print_kernels(p, Phase::decode, "decode", decode_ms, roof);
}

}  // namespace edgellm
