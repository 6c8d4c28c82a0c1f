#include "normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "byte_level.h"
#include "edgellm/error.h"
#include "regex.h"
#include "unicode.h"

namespace edgellm::tok {

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& s : steps_) s->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    regex_.find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size());
    size_t prev = 0;
    for (auto [b, e] : matches) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(text, prev);
    text = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // HF leaves empty strings empty
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!is_white_space(next_codepoint(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      size_t last_kept = begin;
      for (size_t pos = begin; pos < end;) {
        if (!is_white_space(next_codepoint(text, pos))) last_kept = pos;
      }
      end = last_kept;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    bytes_to_chars(text, out);
    text = std::move(out);
  }
};

// Unicode normalization forms (NFC: Qwen2's tokenizer), by ICU, whose tables
// follow the Unicode version as HF's unicode-normalization crate does.
class UnicodeFormNormalizer final : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(const icu::Normalizer2* form) : form_(form) {}
  void normalize(std::string& text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString s = icu::UnicodeString::fromUTF8(text);
    if (form_->isNormalized(s, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = form_->normalize(s, status);
    if (U_FAILURE(status))
      throw Error(std::string("Unicode normalization failed: ") + u_errorName(status));
    text.clear();
    out.toUTF8String(text);
  }

 private:
  const icu::Normalizer2* form_;  // ICU's singleton, never freed
};

std::unique_ptr<Normalizer> make_unicode_form(const std::string& type, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                  : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status) || form == nullptr)
    fail(at_key(where, "type"), "ICU has no " + type + " data (" + u_errorName(status) + ")");
  return std::make_unique<UnicodeFormNormalizer>(form);
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_field(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "normalizers", where);
    if (!list.is_array()) fail(at_key(where, "normalizers"), "expected a list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = make_normalizer(list[i], at_index(at_key(where, "normalizers"), i));
      if (n) steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Replace") {
    const Pattern p = pattern_field(j, where);
    Regex re = p.is_regex ? Regex(p.text, at_key(where, "pattern"))
                          : Regex::literal(p.text, at_key(where, "pattern"));
    return std::make_unique<ReplaceNormalizer>(std::move(re), string_field(j, "content", where));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(string_field(j, "prepend", where));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(bool_field(j, "strip_left", false, where),
                                             bool_field(j, "strip_right", false, where));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
    return make_unicode_form(type, where);
  // Lowercase/Precompiled/Bert: none of the supported models uses them.
  fail(at_key(where, "type"), "normalizer '" + type + "' is not supported");
}

}  // namespace edgellm::tok
