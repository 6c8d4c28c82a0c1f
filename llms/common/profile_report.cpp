#include "profile_report.h"

#include <cstdio>

namespace edgellm {

void print_profile(Session& session, size_t prompt_tokens, int decode_steps) {
  const Profiler& p = session.profiler();
  const double prefill_ms = p.stats(Zone::prefill).seconds * 1e3;
  const double decode_ms = p.stats(Zone::decode).seconds * 1e3;
  const double total_ms = prefill_ms + decode_ms;
  std::printf("\n== profile: phases ==\n");
  std::printf("%-26s %10s\n", "phase", "ms");
  std::printf("%-26s %10.1f\n", "setup", p.stats(Zone::setup).seconds * 1e3);
  std::printf("%-26s %10.1f  (%zu tokens)\n", "prefill total", prefill_ms, prompt_tokens);
  std::printf("%-26s %10.2f  (%d steps)\n", "decode avg per token", decode_steps ? decode_ms / decode_steps : 0.0,
              decode_steps);
  const ZoneStats& head = p.stats(Zone::lm_head);
  std::printf("%-26s %10.2f  (%llu calls)\n", "LM head avg per call", head.calls ? head.seconds * 1e3 / head.calls : 0.0,
              static_cast<unsigned long long>(head.calls));

  std::printf("\n== profile: kernels (prefill + decode) ==\n");
  std::printf("%-16s %10s %7s %8s %10s %10s\n", "kernel", "ms", "share", "calls", "GB/s", "GFLOP/s");
  double covered = 0;
  for (int z = 0; z < static_cast<int>(Zone::count); ++z) {
    const Zone zone = static_cast<Zone>(z);
    if (is_phase(zone)) continue;
    const ZoneStats& s = p.stats(zone);
    if (s.calls == 0) continue;
    covered += s.seconds * 1e3;
    std::printf("%-16s %10.2f %6.1f%% %8llu %10.2f %10.2f\n", std::string(zone_name(zone)).c_str(), s.seconds * 1e3,
                total_ms > 0 ? 100.0 * s.seconds * 1e3 / total_ms : 0.0, static_cast<unsigned long long>(s.calls),
                s.seconds > 0 ? s.bytes / s.seconds / 1e9 : 0.0, s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0);
  }
  std::printf("%-16s %10.2f %6.1f%%\n", "(other)", total_ms - covered,
              total_ms > 0 ? 100.0 * (total_ms - covered) / total_ms : 0.0);
}

}  // namespace edgellm
