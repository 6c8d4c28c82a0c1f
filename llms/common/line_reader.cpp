#include "line_reader.h"

#include <editline/readline.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

namespace edgellm {

LineReader::LineReader(std::istream& in, std::ostream& out)
    : in_(in), out_(out), terminal_(&in == &std::cin && isatty(STDIN_FILENO)) {
  if (terminal_) using_history();
}

std::optional<std::string> LineReader::read(const std::string& prompt) {
  if (!terminal_) {
    out_ << prompt << std::flush;
    std::string line;
    if (!std::getline(in_, line)) return std::nullopt;
    return line;
  }
  char* raw = readline(prompt.c_str());
  if (raw == nullptr) return std::nullopt;
  std::string line(raw);
  std::free(raw);
  if (!line.empty()) add_history(line.c_str());
  return line;
}

}  // namespace edgellm
