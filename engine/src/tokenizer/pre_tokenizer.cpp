#include "pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "byte_level.h"
#include "regex.h"
#include "unicode.h"

namespace edgellm::tok {

namespace {

// HF SplitDelimiterBehavior.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::removed;
  if (s == "Isolated") return Behavior::isolated;
  if (s == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (s == "MergedWithNext") return Behavior::merged_with_next;
  if (s == "Contiguous") return Behavior::contiguous;
  fail(where, "unknown split behavior '" + s + "'");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Covers `text` with alternating non-match / match spans (HF Pattern::find_matches).
std::vector<Span> match_spans(const Regex& re, std::string_view text, bool invert) {
  std::vector<std::pair<size_t, size_t>> found;
  re.find_all(text, found);
  std::vector<Span> spans;
  spans.reserve(found.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : found) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

// NormalizedString::split: turns match spans into kept ranges per behavior.
void split_by_behavior(const Piece& piece, const std::vector<Span>& spans, Behavior behavior,
                       std::vector<Piece>& out) {
  std::vector<std::pair<size_t, size_t>> ranges;
  ranges.reserve(spans.size());
  switch (behavior) {
    case Behavior::isolated:
      for (const Span& s : spans) ranges.emplace_back(s.begin, s.end);
      break;
    case Behavior::removed:
      for (const Span& s : spans)
        if (!s.is_match) ranges.emplace_back(s.begin, s.end);
      break;
    case Behavior::contiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.is_match == prev_match && !ranges.empty()) {
          ranges.back().second = s.end;
        } else {
          ranges.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case Behavior::merged_with_previous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !prev_match && !ranges.empty()) {
          ranges.back().second = s.end;
        } else {
          ranges.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool prev_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !prev_match && !ranges.empty()) {
          ranges.back().first = s.begin;
        } else {
          ranges.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
    }
  }
  for (auto [b, e] : ranges) {
    if (e > b) out.push_back({piece.text.substr(b, e - b), piece.at_origin && b == 0});
  }
}

// Applies `fn` to every piece, collecting its sub-pieces in order.
void for_each_piece(std::vector<Piece>& pieces,
                    const std::function<void(Piece&, std::vector<Piece>&)>& fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (Piece& p : pieces) fn(p, out);
  std::erase_if(out, [](const Piece& p) { return p.text.empty(); });
  pieces = std::move(out);
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) s->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
      split_by_behavior(p, match_spans(regex_, p.text, invert_), behavior_, out);
    });
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, "ByteLevel")
                         : std::unique_ptr<Regex>()) {}
  void split(std::vector<Piece>& pieces) const override {
    for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
      // HF adds the space to every piece that reaches this step, not only the
      // first one of the text.
      if (add_prefix_space_ && !p.text.starts_with(' ')) p.text.insert(p.text.begin(), ' ');
      const size_t first = out.size();
      if (regex_) {
        split_by_behavior(p, match_spans(*regex_, p.text, false), Behavior::isolated, out);
      } else {
        out.push_back(std::move(p));
      }
      for (size_t i = first; i < out.size(); ++i) {
        std::string mapped;
        mapped.reserve(out[i].text.size() * 2);
        bytes_to_chars(out[i].text, mapped);
        out[i].text = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { always, first, never };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split),
        regex_(Regex::literal(replacement_, "Metaspace")) {}
  void split(std::vector<Piece>& pieces) const override {
    for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string text;
      for (char c : p.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      const bool want = prepend_ == Prepend::always || (prepend_ == Prepend::first && p.at_origin);
      if (want && !text.starts_with(replacement_)) text.insert(0, replacement_);
      p.text = std::move(text);
      if (split_) {
        split_by_behavior(p, match_spans(regex_, p.text, false), Behavior::merged_with_next, out);
      } else {
        out.push_back(std::move(p));
      }
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Regex regex_;
};

std::unique_ptr<PreTokenizer> make_metaspace(const json& j, const std::string& where) {
  const std::string replacement = string_field(j, "replacement", where);
  std::string scheme = optional_string(j, "prepend_scheme", where).value_or("always");
  // Older files carry add_prefix_space instead of prepend_scheme.
  if (!bool_field(j, "add_prefix_space", true, where)) scheme = "never";
  MetaspacePreTokenizer::Prepend prepend;
  if (scheme == "always") {
    prepend = MetaspacePreTokenizer::Prepend::always;
  } else if (scheme == "first") {
    prepend = MetaspacePreTokenizer::Prepend::first;
  } else if (scheme == "never") {
    prepend = MetaspacePreTokenizer::Prepend::never;
  } else {
    fail(at_key(where, "prepend_scheme"), "unknown value '" + scheme + "'");
  }
  return std::make_unique<MetaspacePreTokenizer>(replacement, prepend,
                                                 bool_field(j, "split", true, where));
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_field(j, where);
  if (type == "Sequence") {
    const json& list = require_field(j, "pretokenizers", where);
    if (!list.is_array()) fail(at_key(where, "pretokenizers"), "expected a list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_pre_tokenizer(list[i], at_index(at_key(where, "pretokenizers"), i));
      if (p) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    const Pattern p = pattern_field(j, where);
    Regex re = p.is_regex ? Regex(p.text, at_key(where, "pattern"))
                          : Regex::literal(p.text, at_key(where, "pattern"));
    return std::make_unique<SplitPreTokenizer>(
        std::move(re),
        parse_behavior(string_field(j, "behavior", where), at_key(where, "behavior")),
        bool_field(j, "invert", false, where));
  }
  if (type == "Digits") {
    // char::is_numeric is the N categories; runs of them split as one piece
    // unless individual_digits.
    const bool individual = bool_field(j, "individual_digits", false, where);
    return std::make_unique<SplitPreTokenizer>(Regex(individual ? R"(\p{N})" : R"(\p{N}+)", where),
                                               Behavior::isolated, false);
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(bool_field(j, "add_prefix_space", true, where),
                                                   bool_field(j, "use_regex", true, where));
  }
  if (type == "Metaspace") return make_metaspace(j, where);
  fail(at_key(where, "type"), "pre-tokenizer '" + type + "' is not supported");
}

}  // namespace edgellm::tok
