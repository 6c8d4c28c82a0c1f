// `make chat`: an interactive REPL over one warm Session. The conversation's
// tokens stay in the KV cache between turns; each turn prefills only what the
// re-rendered conversation adds after the longest common prefix.
#pragma once

#include <iosfwd>

#include "edgellm/session.h"

namespace edgellm {

// Reads prompts from `in` until EOF (Ctrl-D); streams each reply to `out`.
void run_chat(Session& session, Sampler& sampler, int max_new_tokens, bool raw, std::istream& in,
              std::ostream& out);

}  // namespace edgellm
