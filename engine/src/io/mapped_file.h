// A read-only memory mapping of a whole file (safetensors shards, GGUF files).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "edgellm/error.h"

namespace edgellm {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd_ >= 0, path_ + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    check(::fstat(fd_, &st) == 0, path_ + ": cannot stat");
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      check(p != MAP_FAILED, path_ + ": mmap failed (" + std::strerror(errno) + ")");
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops the whole pages inside [data, data + nbytes) from the process (the file
// stays mapped; a later read faults them back in from the page cache). Setup
// calls it once a tensor is packed, so peak memory is the packed copy, not
// packed + mapped.
inline void release_mapped_pages(const void* data, size_t nbytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const auto begin = (addr + page - 1) / page * page;  // whole pages only
  const auto end = (addr + nbytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace edgellm
