#include "formats/file_check.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <system_error>

#include "runtime/core/error.h"

namespace pooch::file_check {

namespace {

std::atomic<NoteFn> g_note{nullptr};

std::string err_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// The pid in "<base>.tmp-<pid>-<n>", or 0 when `name` is not such a name.
long temp_owner(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
  const char* p = name.c_str() + prefix.size();
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(p, &end, 10);
  if (errno != 0 || end == p || pid <= 0 || *end != '-') return 0;
  const char* q = end + 1;
  if (*q == '\0') return 0;
  for (; *q; ++q)
    if (*q < '0' || *q > '9') return 0;
  return pid;
}

}  // namespace

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int open_regular(const std::string& path, const char* what, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(POOCH_ERR_IO, fmt::format("cannot open '{}': {}; check the path and its "
                                          "permissions",
                                          path, err_text(err)));
  }
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    throw Error(POOCH_ERR_IO,
                fmt::format("cannot read '{}': {}; give the path of {}", path, why, what));
  };
  if (::fstat(fd, st) != 0) refuse(fmt::format("fstat failed: {}", err_text(errno)));
  if (!S_ISREG(st->st_mode))
    refuse(fmt::format("it is {}, not a regular file", file_kind(st->st_mode)));
  // Reads of a regular file never block, but the flag would stay on the
  // descriptor for whoever reads it next.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    refuse(fmt::format("fcntl failed: {}", err_text(errno)));
  if (st->st_size == 0) {
    char c;
    ssize_t got;
    do {
      got = ::pread(fd, &c, 1, 0);
    } while (got < 0 && errno == EINTR);
    if (got > 0)
      refuse(
          "it is a file whose size the system does not report (it says 0 bytes but has content, "
          "as files in /proc and /sys do); copy it to a regular file first");
  }
  return fd;
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  const long self = static_cast<long>(::getpid());
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const long pid = temp_owner(name, base);
    if (pid == 0 || pid == self) continue;
    // ESRCH: no such process. EPERM means it exists (another user's).
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string full = slash == std::string::npos ? name : dir + "/" + name;
    if (::unlink(full.c_str()) == 0) removed.push_back(full);
  }
  ::closedir(d);
  return removed;
}

void set_note_sink(NoteFn fn) {
  g_note.store(fn);
}

void note(const std::string& line) {
  if (NoteFn fn = g_note.load()) fn(line.c_str());
}

}  // namespace pooch::file_check
