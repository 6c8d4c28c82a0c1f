// Tokenizer, StreamDecoder and ChatTemplate on tiny hand-written tokenizer.json
// files, plus the corrupt-input cases that must end in one clear Error.
//
// The expected ids were checked against HF `tokenizers` 0.22 on the same
// files; tests/test_tokenizer.py compares whole corpora on real checkpoints.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "edgellm/error.h"
#include "edgellm/tokenizer.h"
#include "test_util.h"

namespace edgellm {
namespace {

using testing::make_temp_dir;
using testing::write_text;
using Ids = std::vector<int32_t>;

using testing::kBpeJson;

// SentencePiece-style Unigram with byte fallback, Gemma's normalizer/decoder.
const char* kUnigramJson = R"json({"version": "1.0",
 "added_tokens": [
  {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 1, "content": "<bos>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true}],
 "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
 "pre_tokenizer": null,
 "post_processor": {"type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
  "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [1], "tokens": ["<bos>"]}}},
 "decoder": {"type": "Sequence", "decoders": [
  {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
 "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": true,
  "vocab": [["<unk>", 0.0], ["<bos>", 0.0], ["▁", -1.0], ["a", -2.0], ["b", -2.0], ["ab", -1.5],
            ["▁ab", -2.5], ["<0x63>", 0.0], ["<0xC3>", 0.0], ["<0xA9>", 0.0]]}})json";

std::filesystem::path model_dir(const std::string& tokenizer_json, const std::string& config = "") {
  auto dir = make_temp_dir("tokenizer");
  write_text(dir / "tokenizer.json", tokenizer_json);
  if (!config.empty()) write_text(dir / "tokenizer_config.json", config);
  return dir;
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// tokenizer.json with one substring replaced, for the corrupt-file cases.
std::string with(std::string text, const std::string& from, const std::string& to) {
  const size_t p = text.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) text.replace(p, from.size(), to);
  return text;
}

TEST(TokenizerTest, ByteLevelBpeEncode) {
  const Tokenizer t = Tokenizer::load(model_dir(kBpeJson));
  EXPECT_EQ(t.encode("hello world"), (Ids{15, 19}));
  EXPECT_EQ(t.encode("hel"), (Ids{12, 2}));  // "he" merges first; "he l" is no merge
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{8, 9}));
  EXPECT_EQ(t.encode("hello12"), (Ids{15, 10, 11}));  // digits split before "1 2" can merge
  EXPECT_EQ(t.encode("x"), Ids{});                    // no unk token: HF drops the character
  EXPECT_EQ(t.encode("hello x world"), (Ids{15, 7, 19}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(TokenizerTest, AddedTokensAndPostProcessor) {
  const Tokenizer t = Tokenizer::load(model_dir(kBpeJson));
  EXPECT_EQ(t.encode("<|im_start|>hello<|im_end|>"), (Ids{24, 15, 25}));
  EXPECT_EQ(t.encode("hello", /*add_special_tokens=*/true), (Ids{24, 15}));
  EXPECT_EQ(t.encode("", true), (Ids{24}));
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 25);
  EXPECT_EQ(t.token_to_id("hello"), 15);
  EXPECT_EQ(t.token_to_id("absent"), -1);
  EXPECT_EQ(t.vocab_size(), 26u);
  EXPECT_TRUE(t.is_special(24));
  EXPECT_FALSE(t.is_special(15));
}

TEST(TokenizerTest, ByteLevelDecode) {
  const Tokenizer t = Tokenizer::load(model_dir(kBpeJson));
  EXPECT_EQ(t.decode(Ids{15, 19}), "hello world");
  EXPECT_EQ(t.decode(Ids{24, 15, 25}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t.decode(Ids{24, 15, 25}, /*skip_special_tokens=*/true), "hello");
  EXPECT_EQ(t.decode(Ids{8, 9}), "\xC3\xA9");
  EXPECT_EQ(t.decode(Ids{8}), "\xEF\xBF\xBD");     // half a character: U+FFFD, as HF
  EXPECT_EQ(t.decode(Ids{15, 999, -1}), "hello");  // unknown ids are dropped, as HF
}

TEST(TokenizerTest, UnigramWithByteFallback) {
  const Tokenizer t = Tokenizer::load(model_dir(kUnigramJson));
  EXPECT_EQ(t.encode(" ab"), (Ids{6}));  // tie with "▁"+"ab": the first-found path stays
  EXPECT_EQ(t.encode("abab"), (Ids{5, 5}));
  EXPECT_EQ(t.encode("c"), (Ids{7}));  // unknown, but <0x63> exists
  EXPECT_EQ(t.encode("\xC3\xA9"), (Ids{8, 9}));
  EXPECT_EQ(t.encode("d"), (Ids{0}));   // no <0x64>: unk
  EXPECT_EQ(t.encode("cd"), (Ids{0}));  // consecutive unknowns fuse, then need every byte
  EXPECT_EQ(t.encode("ab d"), (Ids{5, 2, 0}));
  EXPECT_EQ(t.encode("<bos>ab"), (Ids{1, 5}));
  EXPECT_EQ(t.encode("ab", true), (Ids{1, 5}));
  EXPECT_EQ(t.decode(Ids{6}), " ab");
  EXPECT_EQ(t.decode(Ids{1, 6}), "<bos> ab");
  EXPECT_EQ(t.decode(Ids{1, 6}, true), " ab");
  EXPECT_EQ(t.decode(Ids{8, 9}), "\xC3\xA9");
  EXPECT_EQ(t.decode(Ids{8}), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, TokenBytesKeepPartsOfACharacter) {
  // Byte-level BPE and byte fallback: "é" is two tokens; each one's decode is
  // U+FFFD, its raw bytes are its half of the character.
  const Tokenizer bpe = Tokenizer::load(model_dir(kBpeJson));
  EXPECT_EQ(bpe.token_bytes(8), "\xC3");
  EXPECT_EQ(bpe.token_bytes(9), "\xA9");
  EXPECT_EQ(bpe.token_bytes(15), bpe.decode(Ids{15}));  // a whole token: its decode
  const Tokenizer uni = Tokenizer::load(model_dir(kUnigramJson));
  EXPECT_EQ(uni.token_bytes(8) + uni.token_bytes(9), "\xC3\xA9");
  EXPECT_EQ(uni.token_bytes(6), " ab");
}

TEST(TokenizerTest, HostileInputDoesNotCrash) {
  const Tokenizer t = Tokenizer::load(model_dir(kBpeJson));
  // Invalid UTF-8 is read as U+FFFD per bad byte, as Python's errors="replace" does.
  EXPECT_EQ(t.encode("\xFF\xFE\xC3"), t.encode("\uFFFD\uFFFD\uFFFD"));
  // A long whitespace run: the split regex must not run out of JIT stack.
  const Ids spaces = t.encode(std::string(200000, ' '));
  EXPECT_EQ(spaces.size(), 200000u);
  const Tokenizer u = Tokenizer::load(model_dir(kUnigramJson));
  EXPECT_EQ(u.encode(std::string(100000, 'a')).size(), 100000u);
}

TEST(StreamDecoderTest, HoldsBackIncompleteCharacters) {
  const Tokenizer t = Tokenizer::load(model_dir(kBpeJson));
  StreamDecoder s(t);
  EXPECT_EQ(s.push(24), "");  // special, skipped by default
  EXPECT_EQ(s.push(15), "hello");
  EXPECT_EQ(s.push(8), "");  // first byte of "é"
  EXPECT_EQ(s.push(9), "\xC3\xA9");
  EXPECT_EQ(s.push(19), " world");
  EXPECT_EQ(s.flush(), "");
  StreamDecoder cut(t, /*skip_special_tokens=*/false);
  EXPECT_EQ(cut.push(24), "<|im_start|>");
  EXPECT_EQ(cut.push(8), "");
  EXPECT_EQ(cut.flush(), "\xEF\xBF\xBD");
}

TEST(StreamDecoderTest, ConcatenationEqualsDecode) {
  const Tokenizer t = Tokenizer::load(model_dir(kUnigramJson));
  const Ids ids{1, 6, 2, 8, 9, 5, 7, 3, 8, 9, 6, 0, 6};
  StreamDecoder s(t, false);
  std::string streamed;
  for (int32_t id : ids) streamed += s.push(id);
  streamed += s.flush();
  EXPECT_EQ(streamed, t.decode(ids));
}

TEST(StreamDecoderTest, RewrittenBytesStayValidUtf8) {
  // "<0x63>" decodes to "c" alone but to U+FFFD next to a dangling lead byte,
  // so the stream cannot equal the full decode; it must stay well-formed.
  const Tokenizer t = Tokenizer::load(model_dir(kUnigramJson));
  StreamDecoder s(t, false);
  std::string streamed;
  for (int32_t id : Ids{5, 7, 8, 3}) streamed += s.push(id);
  streamed += s.flush();
  EXPECT_EQ(streamed,
            "abc\xEF\xBF\xBD"
            "a");
}

TEST(TokenizerErrorTest, MissingAndUnparsableFiles) {
  EXPECT_NE(load_error(make_temp_dir("tokenizer")).find("tokenizer.json: not found"),
            std::string::npos);
  const std::string json = kBpeJson;
  for (const std::string& bad :
       {json.substr(0, json.size() / 2), std::string(), std::string("\x89PNG\r\n\x1a\n\xff")}) {
    const std::string msg = load_error(model_dir(bad));
    EXPECT_NE(msg.find("tokenizer.json: parse error at byte"), std::string::npos) << msg;
  }
  EXPECT_NE(load_error(model_dir("[1, 2]")).find("expected a JSON object"), std::string::npos);
}

TEST(TokenizerErrorTest, CorruptFieldsAreNamed) {
  const std::string b = kBpeJson, u = kUnigramJson;
  const std::pair<std::string, std::string> cases[] = {
      {with(b, R"("type": "BPE")", R"("type": "WordPiece")"),
       "model.type: 'WordPiece' is not supported"},
      {with(b, R"("vocab": {)", R"("vocab": [], "x": {)"), "model.vocab: expected an object"},
      {with(b, R"("h": 0,)", R"("h": -1,)"), "model.vocab.h: token id -1 is out of range"},
      {with(b, R"("h": 0,)", R"("h": "zero",)"), "model.vocab.h: expected an integer"},
      {with(b, R"(["h e",)", R"(["h zz",)"),
       "model.merges[0]: merge token 'zz' is not in the vocabulary"},
      {with(b, R"(["h e",)", R"(["hxe",)"), "model.merges[0]: expected"},
      {with(b, R"("merges": [)", R"("merges": 7, "y": [)"), "model.merges: expected a list"},
      {with(b, R"("model": {)", R"("nodel": {)"), "model: missing"},
      {with(b, R"("individual_digits": true)", R"("individual_digits": "yes")"),
       "pre_tokenizer.pretokenizers[0].individual_digits: expected true/false"},
      {with(
           b, R"({"type": "Digits", "individual_digits": true})",
           R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false})"),
       "pre_tokenizer.pretokenizers[0].pattern: invalid regex '(unclosed'"},
      {with(b, R"("normalizer": null)", R"("normalizer": {"type": "Lowercase"})"),
       "normalizer.type: normalizer 'Lowercase' is not supported"},
      {with(b, R"("decoder": {"type": "ByteLevel")", R"("decoder": {"type": "WordPiece")"),
       "decoder.type: decoder 'WordPiece' is not supported"},
      {with(b, R"("added_tokens": [)", R"("added_tokens": 3, "z": [)"),
       "added_tokens: expected a list"},
      {with(b, R"("content": "<|im_end|>")", R"("contents": "<|im_end|>")"),
       "added_tokens[1].content: missing"},
      {with(b, R"("version": "1.0")", R"("version": "2.0")"),
       "unknown tokenizer.json version '2.0'"},
      {with(b, R"("ids": [24])", R"("ids": ["x"])"),
       "post_processor.special_tokens.<|im_start|>.ids[0]"},
      {with(u, R"(["a", -2.0])", R"(["a"])"), "model.vocab[3]: expected [piece, score]"},
      {with(u, R"("unk_id": 0)", R"("unk_id": 99)"), "model.unk_id: is larger than the vocabulary"},
  };
  for (const auto& [json, expected] : cases) {
    const std::string msg = load_error(model_dir(json));
    EXPECT_NE(msg.find("tokenizer.json: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << "expected '" << expected << "' in: " << msg;
  }
}

// Regression: the Unigram trie was built recursively, one frame per byte, so a
// 200 KB vocabulary piece overflowed the stack.
TEST(TokenizerErrorTest, HugeUnigramPieceLoads) {
  const std::string base = kUnigramJson;
  const std::string huge =
      with(base, R"(["<0xA9>", 0.0])",
           R"(["<0xA9>", 0.0], [")" + std::string(200000, 'x') + R"(", -3.0])");
  const Tokenizer t = Tokenizer::load(model_dir(huge));
  EXPECT_EQ(t.encode("ab"), Tokenizer::load(model_dir(base)).encode("ab"));
  EXPECT_EQ(t.token_to_id(std::string(200000, 'x')), 10);
}

// Regression: Sequence components nested 20k deep recursed per level (stack
// overflow) and rebuilt the error path quadratically (10-60 s). The JSON
// parser now refuses such nesting; a few levels still work.
TEST(TokenizerErrorTest, DeeplyNestedSequencesAreRefused) {
  const std::pair<std::string, std::string> components[] = {
      {"pre_tokenizer", "pretokenizers"}, {"normalizer", "normalizers"}, {"decoder", "decoders"}};
  const std::string b = kBpeJson;
  for (const auto& [component, list] : components) {
    auto nested = [&](int depth) {  // depth + 1 Sequences, each holding the next
      std::string v;
      for (int i = 0; i <= depth; ++i) v += R"({"type": "Sequence", ")" + list + R"(": [)";
      for (int i = 0; i <= depth; ++i) v += "]}";
      return v;
    };
    auto with_value = [&](const std::string& value) {
      nlohmann::json j = nlohmann::json::parse(b);
      j[component] = nullptr;
      std::string text = j.dump();
      const std::string key = "\"" + component + "\":null";
      text.replace(text.find(key), key.size(), "\"" + component + "\":" + value);
      return text;
    };
    const std::string msg = load_error(model_dir(with_value(nested(20000))));
    EXPECT_NE(msg.find("tokenizer.json: JSON nested deeper than"), std::string::npos)
        << component << ": " << msg;
    EXPECT_EQ(load_error(model_dir(with_value(nested(8)))), "") << component;
  }
  const std::string cfg =
      R"({"bos_token": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(load_error(model_dir(b, cfg)).find("tokenizer_config.json: JSON nested deeper than"),
            std::string::npos);
}

TEST(TokenizerErrorTest, CorruptConfigIsNamed) {
  const std::string msg = load_error(model_dir(kBpeJson, "{\"clean_up_tokenization_spaces\": tru"));
  EXPECT_NE(msg.find("tokenizer_config.json: parse error at byte"), std::string::npos) << msg;
  const std::string msg2 =
      load_error(model_dir(kBpeJson, R"({"clean_up_tokenization_spaces": 1})"));
  EXPECT_NE(msg2.find("tokenizer_config.json: clean_up_tokenization_spaces: expected true/false"),
            std::string::npos)
      << msg2;
}

TEST(TokenizerTest, ConfigCleanUpAndLlamaPostProcessor) {
  // transformers' clean_up_tokenization_spaces, and LlamaTokenizerFast rebuilding
  // the post-processor from add_bos_token / add_eos_token.
  const Tokenizer t = Tokenizer::load(
      model_dir(kBpeJson,
                R"({"tokenizer_class": "LlamaTokenizerFast", "clean_up_tokenization_spaces": true,
          "add_bos_token": false, "add_eos_token": true, "eos_token": {"content": "<|im_end|>"}})"));
  EXPECT_EQ(t.encode("hello", true), (Ids{15, 25}));
  const Ids ids = t.encode("hello . world !");  // "hello", "Ġ.", ... with "Ġ" and "." apart
  EXPECT_EQ(ids, (Ids{15, 7, 22, 19, 7, 23}));
  EXPECT_EQ(t.decode(ids), "hello. world!");
  const Tokenizer plain = Tokenizer::load(model_dir(kBpeJson));
  EXPECT_EQ(plain.decode(ids), "hello . world !");
}

// --- chat templates ------------------------------------------------------------------------

const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% "
    "endif %}";

std::filesystem::path template_dir(const std::string& tmpl, const std::string& bos = "") {
  nlohmann::json config = {{"chat_template", tmpl}};
  if (!bos.empty()) config["bos_token"] = bos;
  return model_dir(kBpeJson, config.dump());
}

TEST(ChatTemplateTest, ChatMLWithDefaultSystemPrompt) {
  const ChatTemplate ct = ChatTemplate::load(template_dir(kSmolTemplate));
  ASSERT_TRUE(ct.available());
  EXPECT_EQ(ct.name(), "chatml");
  const std::vector<ChatMessage> user{{"user", "Hi"}};
  EXPECT_EQ(ct.render(user, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> sys{{"system", "Be brief."}, {"user", " Hi "}};
  EXPECT_EQ(ct.render(sys, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n");
}

TEST(ChatTemplateTest, GemmaFoldsSystemIntoFirstTurn) {
  const std::string gemma3 =
      "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
      "messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else "
      "-%}{%- "
      "set first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for "
      "message in loop_messages -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) "
      "-%}{{ "
      "raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
      "{%- endif -%}{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- "
      "else "
      "-%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + "
      "(first_user_prefix if loop.first else \"\") }}{{ message['content'] | trim }}{{ "
      "'<end_of_turn>\\n' }}{%- endfor -%}{%- if add_generation_prompt "
      "-%}{{'<start_of_turn>model\\n'}}"
      "{%- endif -%}";
  const ChatTemplate ct = ChatTemplate::load(template_dir(gemma3, "<bos>"));
  EXPECT_EQ(ct.name(), "gemma");
  const std::vector<ChatMessage> msgs{
      {"system", "Sys"}, {"user", "  Hi\n"}, {"assistant", "Hello"}, {"user", "Bye"}};
  EXPECT_EQ(
      ct.render(msgs, true),
      "<bos><start_of_turn>user\nSys\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  const std::vector<ChatMessage> twice{{"user", "a"}, {"user", "b"}};
  EXPECT_THROW(ct.render(twice, true), Error);
}

TEST(ChatTemplateTest, Llama31PreambleFromTemplate) {
  const std::string llama31 =
      "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}"
      "{%- endif %}{%- if messages[0]['role'] == 'system' %}{%- set system_message = "
      "messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- else %}{%- set "
      "system_message = \"\" %}{%- endif %}{{- "
      "\"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
      "{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" + date_string + "
      "\"\\n\\n\" }}{{- system_message }}{{- \"<|eot_id|>\" }}{%- for message in messages %}{{- "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
      "trim "
      "+ '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
      "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
  const ChatTemplate ct = ChatTemplate::load(template_dir(llama31, "<|begin_of_text|>"));
  EXPECT_EQ(ct.name(), "llama3");
  const std::vector<ChatMessage> msgs{{"user", "Hi "}};
  EXPECT_EQ(
      ct.render(msgs, true),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>"
      "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, MissingUnknownAndCorrupt) {
  EXPECT_FALSE(ChatTemplate::load(model_dir(kBpeJson)).available());
  EXPECT_FALSE(ChatTemplate::load(make_temp_dir("tokenizer")).available());
  // Any template renders, whatever family it looks like.
  const ChatTemplate odd = ChatTemplate::load(template_dir("{{ messages[0]['content'] }}!"));
  EXPECT_TRUE(odd.available());
  EXPECT_EQ(odd.name(), "jinja");
  const std::vector<ChatMessage> msgs{{"user", "Hi"}};
  EXPECT_EQ(odd.render(msgs, true), "Hi!");
  // A construct the interpreter refuses is named with its line, at render.
  const ChatTemplate refused = ChatTemplate::load(template_dir("a\n{% include 'x.jinja' %}"));
  EXPECT_TRUE(refused.available());
  try {
    (void)refused.render(msgs, true);
    ADD_FAILURE() << "an include rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("include"), std::string::npos) << e.what();
  }
  // raise_exception: the template's own message.
  const ChatTemplate raising =
      ChatTemplate::load(template_dir("{{ raise_exception('No system role, please') }}"));
  try {
    (void)raising.render(msgs, true);
    ADD_FAILURE() << "raise_exception rendered";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "chat template: No system role, please");
  }
  EXPECT_THROW(ChatTemplate::load(model_dir(kBpeJson, "{\"chat_template\": ")), Error);
  EXPECT_THROW(ChatTemplate::load(model_dir(kBpeJson, R"({"chat_template": 5})")), Error);
}

TEST(ChatTemplateTest, EosTokenAndKwargsReachTheTemplate) {
  nlohmann::json config = {
      {"chat_template",
       "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
       "{% if enable_thinking is defined %}[{{ enable_thinking }}]{% endif %}"},
      {"eos_token", {{"content", "</s>"}}}};
  const ChatTemplate ct = ChatTemplate::load(model_dir(kBpeJson, config.dump()));
  const std::vector<ChatMessage> msgs{{"user", "a"}, {"assistant", "b"}};
  EXPECT_EQ(ct.render(msgs, false), "a</s>b</s>");
  TemplateInputs in;
  in.kwargs = {{"enable_thinking", false}};
  EXPECT_EQ(ct.render(msgs, false, nullptr, in), "a</s>b</s>[False]");
}

// Each content's bytes are found in the text however the template treats the
// rest (trim, prefixes, a default system turn), so special-token text a user
// types stays plain; where the template branches on the content, whatever
// cannot be matched to the template's own text is plain too, never guessed.
TEST(ChatTemplateTest, ContentSpansFollowTheTemplate) {
  const ChatTemplate ct = ChatTemplate::load(template_dir(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
      "{% endfor %}"));
  const std::vector<ChatMessage> msgs{{"system", " <|im_end|> "}, {"user", "user"}};
  std::vector<TextSpan> spans;
  const std::string text = ct.render(msgs, false, &spans);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(text.substr(spans[0].begin, spans[0].end - spans[0].begin), "<|im_end|>");
  EXPECT_EQ(spans[0].begin, std::string("<|im_start|>system\n").size());
  // "user" also appears as the role: the span is the content's, after the header.
  EXPECT_EQ(spans[1].begin, text.rfind("user<|im_end|>"));
  const ChatTemplate branching = ChatTemplate::load(template_dir(
      "{% for m in messages %}{% if 'x' in m.content %}X{% endif %}[{{ m.content }}]{% endfor %}"));
  const std::vector<ChatMessage> three{{"user", "a"}, {"user", "b"}, {"user", "x"}};
  spans.clear();
  EXPECT_EQ(branching.render(three, false, &spans), "[a][b]X[x]");
  // The third content changed the template's text before it: "b" is not
  // followed by what the template wrote after it. The walk from the start
  // proves "[a][", the walk from the end "]"; the rest, "b]X[x", is plain.
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].begin, 1u);
  EXPECT_EQ(spans[0].end, 2u);
  EXPECT_EQ(spans[1].begin, 4u);
  EXPECT_EQ(spans[1].end, 9u);
}

// An assistant's reasoning_content (a reasoning reply sent back) is plain text
// like its content, wherever the template places it.
TEST(ChatTemplateTest, ReasoningContentIsASpanToo) {
  const ChatTemplate ct = ChatTemplate::load(template_dir(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n"
      "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content | trim }}\n</think>\n{% endif %}"
      "{{ m.content }}<|im_end|>\n{% endfor %}"));
  ChatMessage a{"assistant", "42"};
  a.reasoning_content = " 6*7 <|im_end|> ";
  const std::vector<ChatMessage> msgs{{"user", "6*7?"}, a};
  std::vector<TextSpan> spans;
  const std::string text = ct.render(msgs, false, &spans);
  EXPECT_TRUE(ct.thinks());
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(text.substr(spans[1].begin, spans[1].end - spans[1].begin), "6*7 <|im_end|>");
  EXPECT_EQ(text.substr(spans[2].begin, spans[2].end - spans[2].begin), "42");
}

TEST(ChatTemplateTest, JinjaFileWins) {
  auto dir = template_dir(kSmolTemplate);
  write_text(
      dir / "chat_template.jinja",
      "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m['role'] }}{% endfor %}");
  EXPECT_EQ(ChatTemplate::load(dir).name(), "gemma");
}

}  // namespace
}  // namespace edgellm
