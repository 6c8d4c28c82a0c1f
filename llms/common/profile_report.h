// `make profile`: the per-phase and per-kernel breakdown of one run (to stderr,
// like every figure; stdout holds only the answer).
#pragma once

#include <cstddef>

#include "edgellm/session.h"

namespace edgellm {

void print_profile(Session& session, size_t prompt_tokens, int decode_steps);

}  // namespace edgellm
