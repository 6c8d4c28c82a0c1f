// A folder whose files are named by clients, and none of whose reads or writes
// ever leaves it or blocks: `edgellm serve --slot-save-path DIR` keeps the
// slot files of POST /slots/{id} there, and anyone who can write to DIR may
// have put a symbolic link, a FIFO or a device under any name.
//
// - A name is one plain path component (no '/', not "." or ".."), resolved
//   against a descriptor of the folder (openat), never a path string.
// - Reading opens with O_NOFOLLOW | O_NONBLOCK and then requires a regular file
//   (fstat): a symbolic link is refused, not followed, and a FIFO with no
//   writer, a device or a leased file is refused at once instead of blocking.
// - Writing fills a new hidden file whose name is random and which is created
//   with O_CREAT | O_EXCL | O_NOFOLLOW (never an existing file or a link's
//   target), flushes it to disk and renames it over the name: a rename
//   replaces a symbolic link there, it never writes through it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace edgellm {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

class ConfinedDir {
 public:
  // Error naming `dir` when it is not a directory that can be opened.
  explicit ConfinedDir(const std::filesystem::path& dir);
  ~ConfinedDir();
  ConfinedDir(const ConfinedDir&) = delete;
  ConfinedDir& operator=(const ConfinedDir&) = delete;

  // dir/name, for messages.
  std::string path_of(const std::string& name) const;

  // The regular file `name`, open for reading, and its size in `size`. Error
  // naming it when it is missing, a symbolic link, a directory, FIFO, socket
  // or device, or cannot be opened without waiting.
  File open_regular(const std::string& name, uint64_t& size) const;

  // Replaces `name` atomically with what `write` puts into a new file; `write`
  // returns false when a write failed (errno says why). Error naming `name`
  // when the file cannot be written; no temporary file is left behind.
  void replace(const std::string& name, const std::function<bool(FILE*)>& write) const;

  // A new file `name`, open for writing (mode 0600: slot files hold prompts).
  // Error when anything has that name, a symbolic link included: what
  // replace() creates its temporary file with.
  File create_new(const std::string& name) const;

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
};

}  // namespace edgellm
