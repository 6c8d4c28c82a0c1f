// Per-phase and per-kernel timing. Costs one predictable branch per zone when
// off: Scope reads the clock only when the profiler is enabled.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace edgellm {

enum class Zone : int {
  setup,
  prefill,
  decode,
  embed,
  norm,
  qkv_proj,
  qk_norm,
  rope,
  attention,
  o_proj,
  router,  // a mixture-of-experts block's router matmul and top-k
  gate_up_proj,
  activation,
  down_proj,
  residual,
  lm_head,
  count
};

std::string_view zone_name(Zone zone);
bool is_phase(Zone zone);  // setup / prefill / decode: wall-clock totals, not kernels

struct ZoneStats {
  double seconds = 0;
  uint64_t calls = 0;
  double bytes = 0;  // bytes the kernel had to read or write (for GB/s)
  double flops = 0;  // floating-point operations (for GFLOP/s)
};

// Kernel zones are attributed to the phase that ran them, so decode's
// bandwidth-bound GEMVs and prefill's compute-bound GEMMs are judged apart.
enum class Phase : int { prefill, decode, count };

class Profiler {
 public:
  bool enabled() const { return enabled_; }
  void enable(bool on) { enabled_ = on; }
  void reset() { stats_ = {}; }
  void set_phase(Phase phase) { phase_ = static_cast<int>(phase); }
  const ZoneStats& stats(Zone zone, Phase phase) const {
    return stats_[static_cast<int>(phase)][static_cast<int>(zone)];
  }
  // Phase zones (setup / prefill / decode) are recorded under their own phase.
  const ZoneStats& stats(Zone zone) const {
    return stats(zone, zone == Zone::decode ? Phase::decode : Phase::prefill);
  }
  void add(Zone zone, double seconds, double bytes, double flops) {
    const int phase = zone == Zone::decode                             ? 1
                      : (zone == Zone::prefill || zone == Zone::setup) ? 0
                                                                       : phase_;
    ZoneStats& s = stats_[phase][static_cast<int>(zone)];
    s.seconds += seconds;
    s.calls += 1;
    s.bytes += bytes;
    s.flops += flops;
  }

  class Scope {
   public:
    Scope(Profiler& p, Zone zone, double bytes = 0, double flops = 0)
        : p_(p.enabled_ ? &p : nullptr), zone_(zone), bytes_(bytes), flops_(flops) {
      if (p_) start_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (p_)
        p_->add(zone_,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
                bytes_, flops_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler* p_;
    Zone zone_;
    double bytes_, flops_;
    std::chrono::steady_clock::time_point start_;
  };

 private:
  bool enabled_ = false;
  int phase_ = 0;
  std::array<std::array<ZoneStats, static_cast<int>(Zone::count)>, static_cast<int>(Phase::count)>
      stats_{};
};

}  // namespace edgellm
