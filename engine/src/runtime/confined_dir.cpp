#include "runtime/confined_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "edgellm/error.h"

namespace edgellm {

namespace {

// A name's temporary file adds ".", ".tmp-" and 16 hex digits: the whole must
// fit NAME_MAX (255).
constexpr size_t kMaxName = 200;
constexpr int kCreateAttempts = 8;

std::string errno_text(int err) {
  return std::strerror(err);
}

// The kind of a file that is not regular, for its refusal.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

// 64 bits from the system's entropy source: nobody can guess the name of a
// temporary file before it exists.
std::string random_hex() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) | rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

}  // namespace

ConfinedDir::ConfinedDir(const std::filesystem::path& dir) : dir_(dir) {
  // The folder itself is the operator's choice: a link to it is followed.
  fd_ = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw Error(dir.string() + ": cannot open the folder (" + errno_text(errno) + ")");
}

ConfinedDir::~ConfinedDir() {
  close(fd_);
}

std::string ConfinedDir::path_of(const std::string& name) const {
  return (dir_ / name).string();
}

namespace {

// One plain component, so that openat() on the folder never leaves it.
void check_name(const ConfinedDir& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > kMaxName)
    throw Error(dir.path_of(name) + ": not a plain file name (one path component of 1 to " +
                std::to_string(kMaxName) + " bytes)");
}

}  // namespace

File ConfinedDir::open_regular(const std::string& name, uint64_t& size) const {
  check_name(*this, name);
  const std::string path = path_of(name);
  const int fd =
      openat(fd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) throw Error(path + ": a symbolic link, which is not followed");
    if (err == EWOULDBLOCK)  // a lease: a blocking open would wait for its holder
      throw Error(path + ": busy (another process holds a lease on it; not waited for)");
    throw Error(path + ": cannot open (" + errno_text(err) + ")");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    close(fd);
    throw Error(path + ": not a regular file (" +
                (st.st_mode ? kind_of(st.st_mode) : errno_text(err).c_str()) + ")");
  }
  size = static_cast<uint64_t>(st.st_size);
  File f(fdopen(fd, "rb"));
  if (!f) {
    const int err = errno;
    close(fd);
    throw Error(path + ": cannot open (" + errno_text(err) + ")");
  }
  return f;
}

namespace {

// A new file in the folder, or -1 with errno set.
int open_new(int dir_fd, const std::string& name) {
  return openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

}  // namespace

File ConfinedDir::create_new(const std::string& name) const {
  check_name(*this, name);
  const int fd = open_new(fd_, name);
  if (fd < 0) throw Error(path_of(name) + ": cannot create (" + errno_text(errno) + ")");
  File f(fdopen(fd, "wb"));
  if (!f) {
    const int err = errno;
    close(fd);
    throw Error(path_of(name) + ": cannot create (" + errno_text(err) + ")");
  }
  return f;
}

void ConfinedDir::replace(const std::string& name, const std::function<bool(FILE*)>& write) const {
  check_name(*this, name);
  const std::string fail = path_of(name) + ": cannot write (";
  // Hidden (a leading '.'), so that no name a client may send is a temporary file.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < kCreateAttempts; ++attempt) {
    tmp = "." + name + ".tmp-" + random_hex();
    fd = open_new(fd_, tmp);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error(fail + errno_text(errno) + ")");
  File f(fdopen(fd, "wb"));
  if (!f) {
    const int err = errno;
    close(fd);
    unlinkat(fd_, tmp.c_str(), 0);
    throw Error(fail + errno_text(err) + ")");
  }
  bool ok = write(f.get()) && std::fflush(f.get()) == 0 && fsync(fileno(f.get())) == 0;
  int err = errno;
  if (std::fclose(f.release()) != 0 && ok) {
    ok = false;
    err = errno;
  }
  // renameat replaces whatever has the name, a symbolic link included, and never follows it.
  if (ok && renameat(fd_, tmp.c_str(), fd_, name.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlinkat(fd_, tmp.c_str(), 0);
    throw Error(fail + errno_text(err) + ")");
  }
  fsync(fd_);  // the rename itself on disk; the file is whole either way
}

}  // namespace edgellm
