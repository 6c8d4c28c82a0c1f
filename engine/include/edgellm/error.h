// One exception type for every user- or file-facing failure. The CLI prints its
// message as one line and exits non-zero; the Python binding raises it as
// edgellm.Error. Invariant violations inside kernels are asserts, not Errors.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

namespace edgellm {

class Error : public std::runtime_error {
 public:
  // Messages may quote bytes from a corrupt file (e.g. a JSON parser's "last
  // read"): anything that is not valid UTF-8 or is a control character becomes
  // '?', and a message longer than kMaxChars is cut, so it stays one short
  // printable line however large the quoted value was.
  explicit Error(const std::string& message) : std::runtime_error(printable(message)) {}

  static constexpr size_t kMaxChars = 1000;

 private:
  static std::string printable(const std::string& s) {
    std::string out;
    out.reserve(std::min(s.size(), kMaxChars + 3));
    for (size_t i = 0; i < s.size();) {
      if (out.size() >= kMaxChars) {
        out += "...";
        break;
      }
      const auto c = static_cast<unsigned char>(s[i]);
      const size_t len = c < 0x80           ? 1
                         : (c >> 5) == 0x6  ? 2
                         : (c >> 4) == 0xe  ? 3
                         : (c >> 3) == 0x1e ? 4
                                            : 0;
      bool ok = len > 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k)
        ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (!ok || (len == 1 && (c < 0x20 || c == 0x7f))) {
        out += '?';
        ++i;
      } else {
        out.append(s, i, len);
        i += len;
      }
    }
    return out;
  }
};

// Throws Error when `condition` is false. The message should name the file,
// the field and what was expected versus found.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace edgellm
