#include "runtime/json_matcher.h"

#include <cassert>
#include <cstring>
#include <limits>

namespace edgellm {

namespace {

enum FrameKind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };
// Object states.
enum : uint8_t { kObjOpen, kObjAfterValue, kObjAfterComma, kObjAfterKey };
// Array states.
enum : uint8_t { kArrOpen, kArrAfterValue };
// String states.
enum : uint8_t { kStrChar, kStrEscape, kStrHex, kStrUtf8 };
// Number states: the accepting ones are zero, int, frac, exp_digits.
enum : uint8_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumExp,
  kNumExpSign,
  kNumExpDigits
};

constexpr size_t kMaxDepth = 64;      // frames in one stack (nesting of objects and arrays)
constexpr size_t kMaxStacks = 64;     // alternatives kept open; more are dropped (still sound)
constexpr uint8_t kMaxExpDigits = 2;  // 15 digits and e99 stay well inside a double

bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
// Number frames: flag bit 0 = an integer, bit 1 = negative; an integer's
// magnitude so far in a (low 32 bits) and b (high).
constexpr uint8_t kInteger = 1, kNegative = 2;
int64_t magnitude(const MatchFrame& f) {
  return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(f.b)) << 32) |
                              static_cast<uint32_t>(f.a));
}
void set_magnitude(MatchFrame& f, int64_t m) {
  f.a = static_cast<int32_t>(static_cast<uint32_t>(m));
  f.b = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(m) >> 32));
}
// Some integer that begins with the k digits of magnitude m (m = 0: the number
// 0 itself) lies within [lo, hi]. m * 10^j stays below 10^15: no overflow.
bool viable(int64_t m, int k, bool negative, int64_t lo, int64_t hi) {
  int64_t scale = 1;
  for (int j = 0; k + j <= kMaxDigits; ++j, scale *= 10) {
    if (m == 0 && j > 0) break;
    const int64_t a = m * scale, b = a + scale - 1;
    if ((negative ? -b : a) <= hi && (negative ? -a : b) >= lo) return true;
  }
  return false;
}
bool in_bounds(const MatchFrame& f, const GrammarNode& n) {
  const int64_t v = (f.flag & kNegative) ? -magnitude(f) : magnitude(f);
  return v >= n.minimum && v <= n.maximum;
}
bool number_accepting(const MatchFrame& f, const std::vector<GrammarNode>& nodes) {
  if (f.state == kNumFrac || f.state == kNumExpDigits) return true;
  if (f.state != kNumZero && f.state != kNumInt) return false;
  return !(f.flag & kInteger) || in_bounds(f, nodes[static_cast<size_t>(f.node)]);
}
MatchFrame frame(uint8_t kind, int32_t node, uint8_t state = 0, uint8_t flag = 0) {
  MatchFrame f;
  f.kind = kind;
  f.node = node;
  f.state = state;
  f.flag = flag;
  return f;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar)
    : grammar_(std::move(grammar)), nodes_(&grammar_->nodes) {
  // One stack copy per recursion level. An any_of's alternatives are never
  // any_of (the compiler flattens them), so an expansion nests one level:
  // scratch_[0] holds the stack, scratch_[1] an alternative or a next key.
  scratch_.resize(2);
  state_.frames.push_back(frame(kValue, grammar_->root));
  state_.ends.push_back(1);
}

void JsonMatcher::push(const std::vector<MatchFrame>& s, MatchState& out) const {
  if (out.stacks() >= kMaxStacks) return;
  uint32_t begin = 0;
  for (const uint32_t end : out.ends) {  // an identical stack is there already
    if (end - begin == s.size() && (s.empty() || std::memcmp(out.frames.data() + begin, s.data(),
                                                             s.size() * sizeof(MatchFrame)) == 0))
      return;
    begin = end;
  }
  out.frames.insert(out.frames.end(), s.begin(), s.end());
  out.ends.push_back(static_cast<uint32_t>(out.frames.size()));
}

void JsonMatcher::step(const MatchState& in, uint8_t c, MatchState& out) {
  out.clear();
  uint32_t begin = 0;
  for (const uint32_t end : in.ends) {
    scratch_[0].assign(in.frames.begin() + begin, in.frames.begin() + end);
    step_stack(scratch_[0], c, out, 0);
    begin = end;
  }
}

bool JsonMatcher::accept(std::string_view bytes) {
  for (const char ch : bytes) {
    step(state_, static_cast<uint8_t>(ch), next_);
    if (next_.dead()) return false;
    std::swap(state_, next_);
  }
  return true;
}

bool JsonMatcher::complete() const {
  const MatchState& st = state_;
  uint32_t begin = 0;
  for (const uint32_t end : st.ends) {
    if (end == begin) return true;
    if (end - begin == 1 && st.frames[begin].kind == kNumber &&
        number_accepting(st.frames[begin], *nodes_))
      return true;
    begin = end;
  }
  return false;
}

bool JsonMatcher::ended() const {
  uint32_t begin = 0;
  for (const uint32_t end : state_.ends) {
    if (end != begin) return false;
    begin = end;
  }
  return !state_.dead();
}

int32_t JsonMatcher::string_room() const {
  if (state_.stacks() != 1 || state_.frames.empty()) return -1;  // (empty: the document ended)
  const MatchFrame& f = state_.frames.back();
  if (f.kind != kString || f.state != kStrChar) return -1;
  const int32_t max_len = f.node < 0 ? -1 : (*nodes_)[static_cast<size_t>(f.node)].max_length;
  return max_len < 0 ? std::numeric_limits<int32_t>::max() : max_len - f.a;
}

// Feeds c to the stack s (which it may change), pushing every successor to out.
void JsonMatcher::step_stack(std::vector<MatchFrame>& s, uint8_t c, MatchState& out, size_t level) {
  const std::vector<GrammarNode>& nodes = *nodes_;
  for (;;) {                // a frame that ends without consuming c hands it to its parent
    if (s.empty()) return;  // the document is complete: nothing may follow
    MatchFrame& f = s.back();
    switch (f.kind) {
      case kValue: {
        if (c == ' ' && f.flag) {
          f.flag = 0;
          push(s, out);
          return;
        }
        const GrammarNode& n = nodes[static_cast<size_t>(f.node)];
        switch (n.kind) {
          case GrammarKind::any_of: {
            assert(level + 1 < scratch_.size());
            for (const int32_t alt : n.alternatives) {
              std::vector<MatchFrame>& t = scratch_[level + 1];
              t = s;
              t.back().node = alt;
              t.back().flag = 0;
              step_stack(t, c, out, level + 1);
            }
            return;
          }
          case GrammarKind::object:
            if (c != '{' || s.size() >= kMaxDepth) return;
            f = frame(kObject, f.node, kObjOpen);
            push(s, out);
            return;
          case GrammarKind::array:
            if (c != '[' || s.size() >= kMaxDepth) return;
            f = frame(kArray, f.node, kArrOpen);
            push(s, out);
            return;
          case GrammarKind::string:
            if (c != '"') return;
            f = frame(kString, f.node, kStrChar);
            push(s, out);
            return;
          case GrammarKind::number:
          case GrammarKind::integer:
            f = frame(kNumber, f.node, kNumStart, n.kind == GrammarKind::integer ? kInteger : 0);
            continue;
          case GrammarKind::literal:
            f = frame(kLiteral, f.node);
            continue;
        }
        return;
      }
      case kLiteral: {
        const std::string& text = nodes[static_cast<size_t>(f.node)].text;
        if (static_cast<uint8_t>(text[static_cast<size_t>(f.a)]) != c) return;
        if (static_cast<size_t>(++f.a) == text.size()) s.pop_back();
        push(s, out);
        return;
      }
      case kString: {
        const int32_t max_len = f.node < 0 ? -1 : nodes[static_cast<size_t>(f.node)].max_length;
        const bool room = max_len < 0 || f.a < max_len;
        switch (f.state) {
          case kStrChar:
            if (c == '"') {
              if (f.node >= 0 && f.a < nodes[static_cast<size_t>(f.node)].min_length) return;
              s.pop_back();
            } else if (!room || c < 0x20) {
              return;
            } else if (c == '\\') {
              f.state = kStrEscape;
            } else if (c < 0x80) {
              ++f.a;
            } else {
              // A UTF-8 lead byte: how many continuation bytes and the range of the
              // first (no overlong forms, no surrogates, nothing above U+10FFFF).
              uint8_t lo = 0x80, hi = 0xBF, n = 0;
              if (c >= 0xC2 && c <= 0xDF)
                n = 1;
              else if (c == 0xE0)
                n = 2, lo = 0xA0;
              else if (c == 0xED)
                n = 2, hi = 0x9F;
              else if (c >= 0xE1 && c <= 0xEF)
                n = 2;
              else if (c == 0xF0)
                n = 3, lo = 0x90;
              else if (c >= 0xF1 && c <= 0xF3)
                n = 3;
              else if (c == 0xF4)
                n = 3, hi = 0x8F;
              else
                return;
              ++f.a;
              f.state = kStrUtf8;
              f.aux = n;
              f.b = lo | (hi << 8);
            }
            break;
          case kStrUtf8:
            if (c < (f.b & 0xFF) || c > (f.b >> 8)) return;
            f.b = 0x80 | (0xBF << 8);
            if (--f.aux == 0) {
              f.state = kStrChar;
              f.b = 0;
            }
            break;
          case kStrEscape:
            if (c == 'u') {
              f.state = kStrHex;
              f.aux = 0;
              f.flag = 0;
            } else if (std::strchr("\"\\/bfnrt", c) && c != 0) {
              ++f.a;
              f.state = kStrChar;
            } else {
              return;
            }
            break;
          case kStrHex:
            // No surrogates (\uD800-\uDFFF): a pair would count as one code point
            // for maxLength, a lone one is not Unicode. UTF-8 covers them all.
            if (!is_hex(c)) return;
            if (f.aux == 0 && (c == 'd' || c == 'D')) f.flag = 1;
            if (f.aux == 1 && f.flag && !(c >= '0' && c <= '7')) return;
            if (++f.aux == 4) {
              ++f.a;
              f.state = kStrChar;
              f.aux = 0;
              f.flag = 0;
            }
            break;
        }
        push(s, out);
        return;
      }
      case kNumber: {
        const bool integer = f.flag & kInteger;
        const GrammarNode& n = nodes[static_cast<size_t>(f.node)];
        // An integer takes a digit only when some integer within its bounds
        // still begins with the digits so far.
        const auto digit = [&](int64_t m, int k) {
          if (!integer) return true;
          if (!viable(m, k, f.flag & kNegative, n.minimum, n.maximum)) return false;
          set_magnitude(f, m);
          return true;
        };
        uint8_t next = 255;  // 255: c is not part of the number
        switch (f.state) {
          case kNumStart:
            if (c == '-' && (!integer || n.minimum < 0)) {
              f.flag |= kNegative;
              next = kNumMinus;
              break;
            }
            [[fallthrough]];
          case kNumMinus:
            if (!is_digit(c) || !digit(c - '0', 1)) return;
            next = c == '0' ? kNumZero : kNumInt;
            f.aux = 1;
            break;
          case kNumZero:
          case kNumInt:
            if (f.state == kNumInt && is_digit(c) && f.aux < kMaxDigits) {
              if (!digit(magnitude(f) * 10 + (c - '0'), f.aux + 1)) return;
              next = kNumInt, ++f.aux;
            } else if (!integer && c == '.') {
              next = kNumDot;
            } else if (!integer && (c == 'e' || c == 'E')) {
              next = kNumExp;
            }
            break;
          case kNumDot:
            if (!is_digit(c)) return;
            next = kNumFrac, f.aux = 1;
            break;
          case kNumFrac:
            if (is_digit(c) && f.aux < kMaxDigits)
              next = kNumFrac, ++f.aux;
            else if (c == 'e' || c == 'E')
              next = kNumExp;
            break;
          case kNumExp:
            if (c == '+' || c == '-')
              next = kNumExpSign;
            else if (is_digit(c))
              next = kNumExpDigits, f.aux = 1;
            else
              return;
            break;
          case kNumExpSign:
            if (!is_digit(c)) return;
            next = kNumExpDigits, f.aux = 1;
            break;
          case kNumExpDigits:
            if (is_digit(c) && f.aux < kMaxExpDigits) next = kNumExpDigits, ++f.aux;
            break;
        }
        if (next != 255) {
          f.state = next;
          push(s, out);
          return;
        }
        // The number ended (an accepting state, an integer within its bounds):
        // c belongs to the parent.
        if (integer && !in_bounds(f, n)) return;
        s.pop_back();
        if (s.empty()) return;
        continue;
      }
      case kObject: {
        const GrammarNode& n = nodes[static_cast<size_t>(f.node)];
        const auto required_from = [&](int32_t i) {
          for (size_t j = static_cast<size_t>(i); j < n.properties.size(); ++j)
            if (n.properties[j].required) return true;
          return false;
        };
        const bool can_close = n.free_keys() || !required_from(f.a);
        const auto begin_key = [&] {
          if (n.free_keys()) {
            f.state = kObjAfterKey;
            s.push_back(frame(kString, n.keys, kStrChar));
            push(s, out);
            return;
          }
          // One stack per property that may come next: the following ones up to
          // the first required one.
          for (size_t j = static_cast<size_t>(f.a); j < n.properties.size(); ++j) {
            std::vector<MatchFrame>& t = scratch_[level + 1];
            t = s;
            t.back().state = kObjAfterKey;
            t.back().a = static_cast<int32_t>(j);
            t.push_back(frame(kLiteral, n.properties[j].key));
            push(t, out);
            if (n.properties[j].required) break;
          }
        };
        switch (f.state) {
          case kObjOpen:
            if (c == '}' && can_close) {
              s.pop_back();
              push(s, out);
            } else if (c == '"') {
              begin_key();
            }
            return;
          case kObjAfterValue:
            if (c == '}' && can_close) {
              s.pop_back();
              push(s, out);
            } else if (c == ',' &&
                       (n.free_keys() || static_cast<size_t>(f.a) < n.properties.size())) {
              f.state = kObjAfterComma;
              f.flag = 1;
              push(s, out);
            }
            return;
          case kObjAfterComma:
            if (c == ' ' && f.flag) {
              f.flag = 0;
              push(s, out);
            } else if (c == '"') {
              begin_key();
            }
            return;
          case kObjAfterKey: {
            if (c != ':') return;
            int32_t value = n.additional;
            if (!n.free_keys()) {
              value = n.properties[static_cast<size_t>(f.a)].value;
              ++f.a;
            }
            f.state = kObjAfterValue;
            s.push_back(frame(kValue, value, 0, /*space allowed*/ 1));
            push(s, out);
            return;
          }
        }
        return;
      }
      case kArray: {
        const GrammarNode& n = nodes[static_cast<size_t>(f.node)];
        if (c == ']') {
          if (f.state == kArrOpen ? n.min_items > 0 : f.a < n.min_items) return;
          s.pop_back();
          push(s, out);
          return;
        }
        if (f.state == kArrAfterValue) {
          if (c != ',' || (n.max_items >= 0 && f.a >= n.max_items)) return;
          ++f.a;
          s.push_back(frame(kValue, n.items, 0, /*space allowed*/ 1));
          push(s, out);
          return;
        }
        // The first item begins with c.
        if (n.max_items == 0) return;
        f.state = kArrAfterValue;
        f.a = 1;
        s.push_back(frame(kValue, n.items));
        continue;
      }
    }
    return;
  }
}

}  // namespace edgellm
