#include "decoder.h"

#include "byte_level.h"
#include "regex.h"
#include "unicode.h"

namespace edgellm::tok {

namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, bool keep_bytes) const override {
    for (const auto& s : steps_) s->decode_chain(tokens, keep_bytes);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Byte-level characters back to bytes; a token holding any other character is
// taken as its own UTF-8 (added tokens like "<|im_end|>"). The bytes of all
// tokens are joined before the lossy UTF-8 conversion, so a character split
// across tokens survives.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool keep_bytes) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& t : tokens) {
      token_bytes.clear();
      bool all_mapped = true;
      for (size_t pos = 0; pos < t.size();) {
        const int b = char_to_byte(next_codepoint(t, pos));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        token_bytes += static_cast<char>(b);
      }
      bytes += all_mapped ? token_bytes : t;
    }
    tokens.assign(1, keep_bytes ? bytes : utf8_lossy(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, bool /*keep_bytes*/) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (std::string& t : tokens) {
      matches.clear();
      regex_.find_all(t, matches);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [b, e] : matches) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev);
      t = std::move(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else
// one U+FFFD per byte (HF ByteFallback).
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool keep_bytes) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (keep_bytes || is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') byte = parse_hex(t[3], t[4]);
      if (byte >= 0) {
        pending += static_cast<char>(byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char a, char b) {
    const int hi = hex_digit(a), lo = hex_digit(b);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool /*keep_bytes*/) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character
// from every token (Gemma/Llama 2 strip the space SentencePiece prepends).
class StripDecoder final : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, bool /*keep_bytes*/) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> offsets;  // byte offset of each character, plus the end
      std::vector<uint32_t> chars;
      for (size_t pos = 0; pos < t.size();) {
        offsets.push_back(pos);
        chars.push_back(next_codepoint(t, pos));
      }
      offsets.push_back(t.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, chars.size()) && chars[i] == content_; ++i)
        start_cut = i + 1;
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      t = stop_cut > start_cut
              ? t.substr(offsets[start_cut], offsets[stop_cut] - offsets[start_cut])
              : std::string();
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

// The replacement character back to spaces; in the first token it is dropped
// instead when the pre-tokenizer prepends one.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(uint32_t replacement, bool prepends)
      : replacement_(replacement), prepends_(prepends) {}
  void decode_chain(std::vector<std::string>& tokens, bool /*keep_bytes*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        const size_t begin = pos;
        const uint32_t cp = next_codepoint(t, pos);
        if (cp == replacement_) {
          if (!(i == 0 && prepends_)) out += ' ';
        } else {
          out.append(t, begin, pos - begin);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  uint32_t replacement_;
  bool prepends_;
};

uint32_t single_char(const std::string& s, const std::string& where) {
  size_t pos = 0;
  if (s.empty()) fail(where, "expected one character, found an empty string");
  const uint32_t cp = next_codepoint(s, pos);
  if (pos != s.size()) fail(where, "expected one character, found '" + s + "'");
  return cp;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_field(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "decoders", where);
    if (!list.is_array()) fail(at_key(where, "decoders"), "expected a list");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto d = make_decoder(list[i], at_index(at_key(where, "decoders"), i));
      if (d) steps.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    const Pattern p = pattern_field(j, where);
    Regex re = p.is_regex ? Regex(p.text, at_key(where, "pattern"))
                          : Regex::literal(p.text, at_key(where, "pattern"));
    return std::make_unique<ReplaceDecoder>(std::move(re), string_field(j, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(
        single_char(string_field(j, "content", where), at_key(where, "content")),
        size_field(j, "start", 0, where), size_field(j, "stop", 0, where));
  }
  if (type == "Metaspace") {
    const uint32_t r =
        single_char(string_field(j, "replacement", where), at_key(where, "replacement"));
    std::string scheme = optional_string(j, "prepend_scheme", where).value_or("always");
    if (!bool_field(j, "add_prefix_space", true, where)) scheme = "never";
    return std::make_unique<MetaspaceDecoder>(r, scheme != "never");
  }
  fail(at_key(where, "type"), "decoder '" + type + "' is not supported");
}

}  // namespace edgellm::tok
