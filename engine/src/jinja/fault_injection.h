// Test-only fault injection, as engine/kernels/fault_injection.h does for the
// kernels: each Fault is one bug class the interpreter could have. The
// differential test switches one on (through the Python binding's render_jinja)
// and asserts that the comparison with Python jinja2 then fails, which shows
// that the comparison can catch it. Production code never sets one.
#pragma once

#include <string_view>

namespace edgellm::jinja::fault {

enum class Fault {
  none,
  loop_last_off_by_one,  // loop.last true on the item before the last
  ignore_lstrip_blocks,  // lstrip_blocks ignored by the lexer
};

Fault active();
void set(Fault f);  // tests only
// "none", "loop_last_off_by_one", "ignore_lstrip_blocks"; Fault::none for an unknown name.
Fault from_name(std::string_view name);

}  // namespace edgellm::jinja::fault
