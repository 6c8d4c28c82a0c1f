// Tokenizer interpreting HuggingFace tokenizer.json (byte-level BPE as in
// GPT-2/SmolLM2/Llama 3, and SentencePiece-style BPE with byte fallback as in
// Gemma), plus the model's chat template.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace edgellm {

namespace jinja {
class Template;
}

// A byte range [begin, end) of a text.
struct TextSpan {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  // Reads <model_dir>/tokenizer.json (and tokenizer_config.json when present).
  static Tokenizer load(const std::filesystem::path& model_dir);
  // From a .gguf file's tokenizer.ggml.* metadata (llama.cpp's "gpt2" byte-level
  // BPE or "llama" SentencePiece-style BPE), with no tokenizer.json.
  static Tokenizer from_gguf(const std::filesystem::path& gguf_file);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids equal to HF `tokenizer(text, add_special_tokens=...)["input_ids"]`.
  // Special/added tokens written in the text are matched as tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // As above, except that special-token text inside the `plain` byte ranges is
  // tokenized as ordinary text (HF's split_special_tokens=True, for those bytes
  // only). Chat and the server pass each message's content here, so a user who
  // types "<|im_end|>" cannot forge the template's own markers. Without special
  // text in those ranges the ids equal encode(text, add_special_tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens,
                              std::span<const TextSpan> plain) const;
  // The special tokens encode(text, false, plain) yields, in order, found
  // without tokenizing the rest of the text (a cheap pass).
  std::vector<int32_t> special_tokens_in(std::string_view text,
                                         std::span<const TextSpan> plain = {}) const;
  // Equal to HF `tokenizer.decode(ids, skip_special_tokens=...)`.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One token's text as raw bytes: decode({id}) except that a token holding
  // part of a UTF-8 character keeps those bytes (decode gives U+FFFD). The
  // `bytes` of OpenAI's logprobs.
  std::string token_bytes(int32_t id) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // One past the largest id of the vocabulary and the added tokens: the
  // number of embedding rows the tokenizer can address.
  size_t vocab_size() const;
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Turns a stream of ids into text pieces as they arrive, holding back bytes
// until they form complete UTF-8 characters. Concatenating every push() and
// the final flush() gives the decode of all ids (before transformers'
// clean_up_tokenization_spaces, which cannot be applied to a stream).
class StreamDecoder {
 public:
  // `kept_special`: special tokens decoded even when the others are skipped
  // (a harmony reply's markers).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true,
                         std::vector<std::string> kept_special = {});
  std::string push(int32_t id);  // text that became printable with this id
  std::string flush();           // whatever is left (invalid bytes as U+FFFD)

 private:
  // HF DecodeStream: only a window of recent ids is re-decoded per push; the
  // id before the new text stays in it so decoders that treat the first token
  // specially (Metaspace, Strip) see the same context as a full decode.
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<std::string> kept_special_;
  std::vector<int32_t> ids_;  // the window
  std::string prefix_;        // decode of ids_[0, prefix_index_) already returned
  size_t prefix_index_ = 0;
};

// A function call the assistant made (OpenAI's tool_calls[i]): `arguments` is
// JSON text of an object, as OpenAI sends it.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool"
  std::string content;
  // An assistant turn's calls: a template that renders tools lays them out
  // itself; for one that does not, tool_conversation (tool_calls.h) writes them
  // into the content first.
  std::vector<ToolCall> tool_calls = {};
  std::string tool_call_id = {};  // a "tool" result: the call it answers
  std::string name = {};          // a "tool" result: the function's name (OpenAI's name)
  // An assistant turn's reasoning (its <think> block, as a reasoning model's
  // reply returned it): templates that lay it out (Qwen3) read it; plain text
  // like the content.
  std::string reasoning_content = {};
};

// What a template sees beyond the messages: the request's tools (OpenAI's
// "tools" list; null for none) and extra kwargs (chat_template_kwargs, e.g.
// enable_thinking).
struct TemplateInputs {
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// The model's own chat template (chat_template.jinja, else tokenizer_config.json's
// "chat_template", the "default" one of a named list, or a GGUF's
// tokenizer.chat_template), parsed once by the Jinja interpreter
// (edgellm/jinja.h) and rendered with what transformers passes: the text equals
// HF apply_chat_template(..., tokenize=False) for any template it can parse.
class ChatTemplate {
 public:
  static ChatTemplate load(const std::filesystem::path& model_dir);
  // A .gguf file's tokenizer.chat_template (none when it has no template).
  static ChatTemplate from_gguf(const std::filesystem::path& gguf_file);
  // The template text itself; `source` names where it came from in messages.
  static ChatTemplate from_text(const std::string& tmpl, const std::string& bos_token,
                                const std::string& source, const std::string& eos_token = "");
  bool available() const { return program_ || !parse_error_.empty(); }
  // Throws Error for a template that failed to parse (naming the construct and
  // line) or that refuses the conversation (raise_exception: jinja::RaisedError).
  // `plain_spans`, when given, receives the byte ranges of the returned text
  // to read as plain text (Tokenizer::encode): where each message's content and
  // reasoning landed, and any stretch not proven to be the template's own text
  // (where the template rewrote a content). `template_text` receives the same
  // render with every content replaced by a marker: the template's own text.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                     std::vector<TextSpan>* plain_spans = nullptr,
                     const TemplateInputs& inputs = {}, std::string* template_text = nullptr) const;
  // The family its markers show (chatml, gemma, llama3), else "jinja"; "none"
  // without a template. For display: every template renders the same way.
  const std::string& name() const { return name_; }
  // The system prompt a ChatML template inserts when a conversation has none:
  // kept when tool_conversation adds a system turn of its own.
  const std::string& default_system() const { return default_system_; }
  // The template names `tools`: it lays out tools, calls and results itself.
  bool renders_tools() const { return renders_tools_; }
  // The text a reply in this template's call format starts with: what a forced
  // call's prompt ends with ("<tool_call>\n" Hermes/Qwen, "[TOOL_CALLS]"
  // Mistral, nothing for a bare JSON call as Llama 3.1 writes it).
  const std::string& call_prefix() const { return call_prefix_; }
  // The template raises unless roles alternate user/assistant (Gemma): a tool
  // result goes in a user turn there.
  bool alternates() const { return alternates_; }
  // The template lays out reasoning blocks (<think>...</think>: Qwen3, DeepSeek
  // R1): replies are split into reasoning and content (edgellm/reasoning.h).
  bool thinks() const { return thinks_; }
  // The template writes OpenAI's harmony format (gpt-oss: <|channel|> headers):
  // replies are split by channel and read for calls (edgellm/harmony.h).
  bool harmony() const { return harmony_; }

 private:
  std::shared_ptr<const jinja::Template> program_;  // null when the text did not parse
  std::string parse_error_;                         // why, naming the line
  std::string name_ = "none";
  std::string source_;  // where the template came from, for error messages
  std::string bos_token_, eos_token_;
  std::string default_system_;
  bool thinks_ = false;
  bool harmony_ = false;
  std::string call_prefix_;
  bool renders_tools_ = false;
  bool alternates_ = false;
};

// The tokens of a rendered conversation, with every message's content encoded
// as plain text (see Tokenizer::encode): what chat and the server feed the model.
// Fails closed (Error, a 400): special-token text in any other string of the
// request, or special tokens that differ from the template's own (a template
// that rewrites message text so that it cannot be located), is refused.
std::vector<int32_t> encode_conversation(const Tokenizer& tokenizer, const ChatTemplate& chat,
                                         std::span<const ChatMessage> messages,
                                         bool add_generation_prompt,
                                         const TemplateInputs& inputs = {});

}  // namespace edgellm
