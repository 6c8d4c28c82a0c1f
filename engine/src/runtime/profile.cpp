#include "edgellm/profile.h"

namespace edgellm {

std::string_view zone_name(Zone zone) {
  switch (zone) {
    case Zone::setup:
      return "setup";
    case Zone::prefill:
      return "prefill";
    case Zone::decode:
      return "decode";
    case Zone::embed:
      return "embedding";
    case Zone::norm:
      return "rmsnorm";
    case Zone::qkv_proj:
      return "qkv_proj";
    case Zone::qk_norm:
      return "qk_norm";
    case Zone::rope:
      return "rope+kv_write";
    case Zone::attention:
      return "attention";
    case Zone::o_proj:
      return "o_proj";
    case Zone::router:
      return "moe_router";
    case Zone::gate_up_proj:
      return "gate_up_proj";
    case Zone::activation:
      return "activation";
    case Zone::down_proj:
      return "down_proj";
    case Zone::residual:
      return "residual_add";
    case Zone::lm_head:
      return "lm_head";
    case Zone::count:
      break;
  }
  return "?";
}

bool is_phase(Zone zone) {
  return zone == Zone::setup || zone == Zone::prefill || zone == Zone::decode;
}

}  // namespace edgellm
