// `make chat`: an interactive REPL over one warm Session. The conversation's
// tokens stay in the KV cache between turns; each turn prefills only what the
// re-rendered conversation adds after the longest common prefix. The user's
// text is encoded as plain text, so only the template's own markers are
// special tokens (no turn injection by typing "<|im_end|>").
#pragma once

#include <iosfwd>

#include "edgellm/session.h"
#include "line_reader.h"

namespace edgellm {

// Reads lines until /exit or end of input (Ctrl-D); streams each reply to
// `out`. Ctrl-C stops the current reply and keeps the conversation.
// `templated`: render the conversation with the chat template, else raw text.
void run_chat(Session& session, Sampler& sampler, int max_new_tokens, bool templated,
              LineReader& reader, std::ostream& out);

}  // namespace edgellm
