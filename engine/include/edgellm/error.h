// One exception type for every user- or file-facing failure. The CLI prints its
// message as one line and exits non-zero; the Python binding raises it as
// edgellm.Error. Invariant violations inside kernels are asserts, not Errors.
#pragma once

#include <stdexcept>
#include <string>

namespace edgellm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error when `condition` is false. The message should name the file,
// the field and what was expected versus found.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace edgellm
