// Where `make chat` reads its lines: libedit (line editing and history, the
// BSD editline library from Debian) on a terminal, plain getline otherwise
// (pipes, scripts, tests).
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

namespace edgellm {

class LineReader {
 public:
  LineReader(std::istream& in, std::ostream& out);
  // The next line without its newline; nullopt at end of input (Ctrl-D). An
  // empty line comes back when Ctrl-C interrupted the editing.
  std::optional<std::string> read(const std::string& prompt);

 private:
  std::istream& in_;
  std::ostream& out_;
  bool terminal_;
};

}  // namespace edgellm
