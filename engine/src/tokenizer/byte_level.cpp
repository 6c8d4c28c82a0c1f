#include "byte_level.h"

#include <array>
#include <cstdint>

#include "unicode.h"

namespace edgellm::tok {

namespace {

// Printable Latin-1 bytes map to themselves; the other 68 bytes take the code
// points 256, 257, ... in byte order (GPT-2's bytes_to_unicode).
struct Tables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte;
  Tables() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next++;
      append_utf8(byte_to_utf8[b], cp);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void bytes_to_chars(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (unsigned char b : bytes) out += t.byte_to_utf8[b];
}

int char_to_byte(uint32_t codepoint) {
  return codepoint < 512 ? tables().cp_to_byte[codepoint] : -1;
}

}  // namespace edgellm::tok
