#include "chat_repl.h"

#include <csignal>

#include <atomic>
#include <iostream>
#include <string>
#include <vector>

#include "progress.h"

namespace edgellm {

namespace {

std::atomic<bool> g_interrupted{false};

// Ctrl-C while a reply streams stops that reply, not the program.
class InterruptGuard {
 public:
  InterruptGuard() {
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_interrupted = true; };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &previous_);
  }
  ~InterruptGuard() { sigaction(SIGINT, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

constexpr const char* kHelp =
    "  /help   this text\n"
    "  /reset  forget the conversation\n"
    "  /exit   quit (or Ctrl-D)\n"
    "  Ctrl-C  stop the reply being written (the conversation keeps what was said)\n";

class Conversation {
 public:
  Conversation(Session& session, bool templated) : session_(session), templated_(templated) {}

  void clear() {
    messages_.clear();
    transcript_.clear();
    cached_.clear();
  }
  bool empty() const { return messages_.empty() && transcript_.empty(); }

  // The tokens of the conversation with `line` added as the user's turn.
  std::vector<int32_t> tokens_with(const std::string& line) {
    if (templated_) {
      messages_.push_back({"user", line});
      return encode_conversation(session_.tokenizer(), session_.chat_template(), messages_, true);
    }
    transcript_ += line;
    return session_.tokenizer().encode(transcript_, /*add_special_tokens=*/true);
  }
  void drop_last_user_turn(const std::string& line) {
    if (templated_)
      messages_.pop_back();
    else
      transcript_.resize(transcript_.size() - line.size());
  }
  void add_reply(const std::string& text) {
    if (templated_)
      messages_.push_back({"assistant", text});
    else
      transcript_ += text + "\n";
  }
  std::vector<int32_t>& cached() { return cached_; }

 private:
  Session& session_;
  bool templated_;
  std::vector<ChatMessage> messages_;
  std::string transcript_;       // raw mode: the running text
  std::vector<int32_t> cached_;  // tokens whose K/V are in the cache, in order
};

}  // namespace

void run_chat(Session& session, Sampler& sampler, int max_new_tokens, bool templated,
              LineReader& reader, std::ostream& out) {
  const int context = session.max_context();
  Conversation conv(session, templated);
  InterruptGuard guard;
  out << "chat with "
      << (templated ? "the chat template (" + session.chat_template().name() + ")" : "raw text")
      << "; /help for commands, Ctrl-D quits\n";
  for (;;) {
    g_interrupted = false;
    const std::optional<std::string> input = reader.read("> ");
    if (!input && g_interrupted) {  // Ctrl-C at the prompt drops the line, as a shell does
      out << "\n";
      continue;
    }
    if (!input) break;
    const std::string& line = *input;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      out << kHelp;
      continue;
    }
    if (line == "/reset") {
      conv.clear();
      out << "(conversation cleared)\n";
      continue;
    }
    const bool had_history = !conv.empty();
    std::vector<int32_t> tokens = conv.tokens_with(line);
    if (tokens.size() + 1 >= static_cast<size_t>(context) && had_history) {
      conv.drop_last_user_turn(line);
      out << "(the context is full: the conversation would need " << tokens.size() + 1 << " of "
          << context << " positions; starting a new conversation with this message)\n";
      conv.clear();
      tokens = conv.tokens_with(line);
    }
    if (tokens.size() + 1 >= static_cast<size_t>(context)) {
      out << "(this message alone needs " << tokens.size() + 1 << " of " << context
          << " positions; not sent. Raise --max-context or shorten it)\n";
      conv.clear();
      continue;
    }
    // Reuse the cached prefix; prefill needs at least the last token anew.
    std::vector<int32_t>& cached = conv.cached();
    size_t common = 0;
    while (common < cached.size() && common + 1 < tokens.size() && cached[common] == tokens[common])
      ++common;
    const std::span<const int32_t> fresh(tokens.data() + common, tokens.size() - common);
    int32_t next;
    {
      Progress note("prefill of " + std::to_string(fresh.size()) + " tokens");
      next = sampler.sample(session.prefill(fresh, static_cast<int>(common)));
    }
    cached = tokens;
    StreamDecoder stream(session.tokenizer());
    std::vector<int32_t> reply;
    int pos = static_cast<int>(tokens.size());
    std::string note;
    while (!session.config().is_eos(next)) {
      reply.push_back(next);
      out << stream.push(next) << std::flush;
      if (g_interrupted) {
        note = "(stopped)";
        break;
      }
      if (static_cast<int>(reply.size()) >= max_new_tokens) break;
      if (pos + 1 >= context) {
        note = "(the context is full: the reply was cut; /reset starts a new conversation)";
        break;
      }
      cached.push_back(next);
      next = sampler.sample(session.decode_step(next, pos++));
    }
    out << stream.flush() << "\n";
    if (!note.empty()) out << note << "\n";
    conv.add_reply(session.tokenizer().decode(reply, /*skip_special_tokens=*/true));
  }
  out << "\n";
}

}  // namespace edgellm
