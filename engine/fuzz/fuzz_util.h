// Shared by the libFuzzer targets (one fuzz_<name>.cpp per parser, seeds in
// corpus/<name>/; `make fuzz` runs them all). The parsers read files, so each
// input is written into a per-process scratch directory first. An Error is the
// expected outcome of a bad input; anything else escaping (another exception,
// a crash, a sanitizer report) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace edgellm::fuzz {

// In memory (/dev/shm) when there is one: a run is a few file writes, and a
// disk-backed /tmp made I/O, not parsing, the bottleneck.
inline const std::filesystem::path& scratch_dir() {
  // Never destroyed, so the exit handler that removes it can still read it.
  static const auto* dir = [] {
    const std::filesystem::path shm = "/dev/shm";
    const auto base =
        std::filesystem::is_directory(shm) ? shm : std::filesystem::temp_directory_path();
    auto* d = new std::filesystem::path(base / ("edgellm_fuzz_" + std::to_string(::getpid())));
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return d;
  }();
  return *dir;
}

inline void write_file(const std::string& name, const uint8_t* data, size_t size) {
  std::ofstream(scratch_dir() / name, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

inline void remove_file(const std::string& name) {
  std::filesystem::remove(scratch_dir() / name);
}

}  // namespace edgellm::fuzz
