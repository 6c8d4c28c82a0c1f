#include "chat_repl.h"

#include <csignal>

#include <atomic>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "edgellm/generate.h"
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
  Conversation(Session& session, bool templated, const std::string& system)
      : session_(session), templated_(templated) {
    if (!system.empty()) system_.push_back({"system", system});
    clear();
  }

  void clear() {
    messages_ = system_;
    transcript_.clear();
    cached_.clear();
  }
  bool empty() const { return messages_.size() == system_.size() && transcript_.empty(); }

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
  std::vector<ChatMessage> system_;  // the --system message, kept by /reset
  std::vector<ChatMessage> messages_;
  std::string transcript_;       // raw mode: the running text
  std::vector<int32_t> cached_;  // tokens whose K/V are in the cache, in order
};

}  // namespace

void run_chat(Session& session, const GenerateOptions& options, int max_new_tokens, bool templated,
              const std::string& system, LineReader& reader, std::ostream& out) {
  const int context = session.max_context();
  uint64_t turns = 0;
  Conversation conv(session, templated, system);
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
    GenerateOptions turn = options;
    turn.max_tokens = max_new_tokens;
    turn.cancel = &g_interrupted;  // Ctrl-C: the reply stops before its next token
    // Each turn samples with its own seed, so a conversation repeats as a whole.
    turn.sampling.seed = options.sampling.seed + turns++;
    std::optional<Progress> note(std::in_place,
                                 "prefill of " + std::to_string(fresh.size()) + " tokens");
    const GenerateResult r = generate(
        session.context(), fresh, turn,
        [&](int32_t, std::string_view text) {
          note.reset();
          out << text << std::flush;
          return true;
        },
        static_cast<int>(common));
    note.reset();
    out << "\n";
    // The cache now holds the conversation and the reply tokens that were run.
    cached.resize(common);
    cached.insert(cached.end(), fresh.begin(), fresh.end());
    cached.insert(cached.end(), r.tokens.begin(),
                  r.tokens.begin() + (r.end_pos - static_cast<int>(tokens.size())));
    if (r.finish == FinishReason::cancelled)
      out << "(stopped)\n";
    else if (r.finish == FinishReason::length && r.end_pos >= context)
      out << "(the context is full: the reply was cut; /reset starts a new conversation)\n";
    conv.add_reply(r.text);  // what was shown: cut before a stop string
  }
  out << "\n";
}

}  // namespace edgellm
