// Test-only fault injection: each Fault is one bug class a fast kernel could
// have. A kernel consults fault::active() once per call, outside its inner
// loops, at the place that bug would live; the unit tests switch a fault on and
// assert that their rounding-aware check catches it (the check's power, shown
// on the real kernel, not on a copy). Production code never sets one.
#pragma once

#include <string_view>

namespace edgellm::kernels::fault {

enum class Fault {
  none,
  bf16_truncate,         // x -> bf16 by truncation instead of round-to-nearest-even
  drop_k_tail,           // the GEMM's last K block (column pairs) left out
  kv_scale_wrong_block,  // a q8_0 KV block dequantized with its neighbour's scale
  v_through_k_scale,     // V dequantized with K's per-block scale
  stale_tile_config,     // AMX tile config of the previous shape kept after a shape change
  skip_attention_block,  // one key block at a boundary skipped by flash attention
  swiglu_clamp_dropped,  // gpt-oss's SwiGLU (swiglu_oai_mul) without its clamp
  // A gpt-oss router (top-k logits, softmax over those) run as softmax over every expert,
  // then top-k (models/moe.cpp): the gate's mutant of a family switch, not a kernel's bug.
  moe_softmax_over_all_experts,
  c4_codes_as_values,         // c4 codes multiplied as they are, the codebook lookup skipped
  last = c4_codes_as_values,  // what from_name() searches up to: keep it the last fault
};

Fault active();
void set(Fault f);  // tests only
std::string_view name(Fault f);
Fault from_name(std::string_view name);  // none when no fault has that name

// Sets a fault for one scope (tests).
class Scoped {
 public:
  explicit Scoped(Fault f) { set(f); }
  ~Scoped() { set(Fault::none); }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;
};

}  // namespace edgellm::kernels::fault
