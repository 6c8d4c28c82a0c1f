#include "kernels/fault_injection.h"

#include <atomic>

namespace edgellm::kernels::fault {

namespace {
std::atomic<Fault> g_fault{Fault::none};
}  // namespace

Fault active() {
  return g_fault.load(std::memory_order_relaxed);
}

void set(Fault f) {
  g_fault.store(f, std::memory_order_relaxed);
}

std::string_view name(Fault f) {
  switch (f) {
    case Fault::none:
      return "none";
    case Fault::bf16_truncate:
      return "bf16 truncation instead of RNE";
    case Fault::drop_k_tail:
      return "dropped K-tail block";
    case Fault::kv_scale_wrong_block:
      return "wrong per-block KV scale";
    case Fault::v_through_k_scale:
      return "V read through K's scale";
    case Fault::stale_tile_config:
      return "stale tile config after a shape change";
    case Fault::skip_attention_block:
      return "skipped attention block at a boundary";
    case Fault::swiglu_clamp_dropped:
      return "SwiGLU clamp dropped";
    case Fault::moe_softmax_over_all_experts:
      return "router softmax over all experts";
    case Fault::c4_codes_as_values:
      return "c4 codes used without their codebook";
  }
  return "?";
}

Fault from_name(std::string_view n) {
  for (int f = 0; f <= static_cast<int>(Fault::last); ++f)
    if (name(static_cast<Fault>(f)) == n) return static_cast<Fault>(f);
  return Fault::none;
}

}  // namespace edgellm::kernels::fault
