#include "chat_repl.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace edgellm {

void run_chat(Session& session, Sampler& sampler, int max_new_tokens, bool raw, std::istream& in,
              std::ostream& out) {
  const bool templated = !raw && session.chat_template().available();
  std::vector<ChatMessage> messages;
  std::vector<int32_t> cached;  // tokens whose K/V are in the cache, in order
  std::string transcript;       // raw mode: the running text
  out << "chat with "
      << (templated ? "the chat template (" + session.chat_template().name() + ")" : "raw text")
      << "; /reset clears the conversation, Ctrl-D quits\n";
  for (std::string line; out << "> " << std::flush, std::getline(in, line);) {
    if (line.empty()) continue;
    if (line == "/reset") {
      messages.clear();
      cached.clear();
      transcript.clear();
      out << "(conversation cleared)\n";
      continue;
    }
    std::vector<int32_t> tokens;
    if (templated) {
      messages.push_back({"user", line});
      tokens = session.tokenizer().encode(session.chat_template().render(messages, true));
    } else {
      transcript += line;
      tokens = session.tokenizer().encode(transcript, /*add_special_tokens=*/true);
    }
    if (tokens.size() + 1 >= static_cast<size_t>(session.max_context())) {
      out << "(the conversation no longer fits the context of " << session.max_context()
          << " tokens; starting over)\n";
      messages.clear();
      cached.clear();
      transcript.clear();
      continue;
    }
    // Reuse the cached prefix; prefill needs at least the last token anew.
    size_t common = 0;
    while (common < cached.size() && common + 1 < tokens.size() && cached[common] == tokens[common])
      ++common;
    const std::span<const int32_t> fresh(tokens.data() + common, tokens.size() - common);
    int32_t next = sampler.sample(session.prefill(fresh, static_cast<int>(common)));
    cached = tokens;
    StreamDecoder stream(session.tokenizer());
    std::vector<int32_t> reply;
    int pos = static_cast<int>(tokens.size());
    while (!session.config().is_eos(next)) {
      reply.push_back(next);
      out << stream.push(next) << std::flush;
      if (static_cast<int>(reply.size()) >= max_new_tokens || pos + 1 >= session.max_context())
        break;
      cached.push_back(next);
      next = sampler.sample(session.decode_step(next, pos++));
    }
    out << stream.flush() << "\n";
    const std::string text = session.tokenizer().decode(reply, /*skip_special_tokens=*/true);
    if (templated)
      messages.push_back({"assistant", text});
    else
      transcript += text + "\n";
  }
  out << "\n";
}

}  // namespace edgellm
