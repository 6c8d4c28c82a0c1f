#include "jinja/fault_injection.h"

#include <atomic>

namespace edgellm::jinja::fault {

namespace {
std::atomic<Fault> g_active{Fault::none};
}

Fault active() {
  return g_active.load(std::memory_order_relaxed);
}
void set(Fault f) {
  g_active.store(f, std::memory_order_relaxed);
}

Fault from_name(std::string_view name) {
  if (name == "loop_last_off_by_one") return Fault::loop_last_off_by_one;
  if (name == "ignore_lstrip_blocks") return Fault::ignore_lstrip_blocks;
  return Fault::none;
}

}  // namespace edgellm::jinja::fault
