#include "formats/xmc_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/core/error.h"

namespace pooch::xmc_io {

namespace {

constexpr size_t kEdgeBytes = 64 * 1024;

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err,
                          const char* todo) {
  throw Error(POOCH_ERR_IO,
              fmt::format("cannot {} '{}': {}; {}", what, path, errno_text(err), todo));
}

// Reads exactly n bytes at offset, retrying short reads and EINTR.
bool pread_full(int fd, char* dst, size_t n, uint64_t off) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    dst += got;
    n -= static_cast<size_t>(got);
    off += static_cast<uint64_t>(got);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string errno_text(int err) {
  return std::strerror(err);
}

MappedFile::MappedFile(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) io_fail("open", path, errno, "check the path and its permissions");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) io_fail("stat", path, errno, "check the path and its permissions");
  if (S_ISDIR(st.st_mode))
    throw Error(
        POOCH_ERR_IO,
        fmt::format("cannot read '{}': it is a directory; give the path of a data file", path));
  if (S_ISREG(st.st_mode)) {
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return;  // mmap of length 0 fails; an empty view says it all
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (map_ != MAP_FAILED) {
      ::madvise(map_, size_, MADV_SEQUENTIAL);
      data_ = static_cast<const char*>(map_);
      return;
    }
    map_ = nullptr;  // a file system without mmap: fall through to read()
  }
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(f.fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_fail("read", path, errno, "check that the file is readable");
    if (got == 0) break;
    buf_.append(chunk, static_cast<size_t>(got));
  }
  data_ = buf_.data();
  size_ = buf_.size();
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(map_, size_);
}

FileId file_id(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) io_fail("open", path, errno, "check the path and its permissions");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) io_fail("stat", path, errno, "check the path and its permissions");
  FileId id;
  id.regular = S_ISREG(st.st_mode);
  if (!id.regular) return id;
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  // Hashing the two ends catches a rewrite that keeps size and mtime (a copy
  // with preserved times, a clock that did not advance) where it most often
  // shows: a changed header or a changed tail.
  std::string buf(std::min<uint64_t>(id.size, kEdgeBytes), '\0');
  if (!pread_full(f.fd, buf.data(), buf.size(), 0))
    io_fail("read", path, errno ? errno : EIO, "check that the file is readable");
  id.head_hash = XXH3_64bits(buf.data(), buf.size());
  if (!pread_full(f.fd, buf.data(), buf.size(), id.size - buf.size()))
    io_fail("read", path, errno ? errno : EIO, "check that the file is readable");
  id.tail_hash = XXH3_64bits(buf.data(), buf.size());
  return id;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // pid plus a process-wide counter keeps concurrent writers (threads or
  // processes) of the same target on distinct temporary files.
  static std::atomic<uint64_t> counter{0};
  tmp_ = fmt::format("{}.tmp.{}.{}", path_, static_cast<long>(::getpid()), counter++);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail("create", tmp_, errno, "check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd_, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) io_fail("write", tmp_, errno, "check the free disk space");
    p += put;
    n -= static_cast<size_t>(put);
  }
}

void AtomicFile::commit() {
  // fsync before rename: otherwise a crash can leave the new name pointing
  // at a file whose data never reached the disk.
  if (::fsync(fd_) != 0) io_fail("sync", tmp_, errno, "check the free disk space");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    io_fail("close", tmp_, err, "check the free disk space");
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    io_fail("rename the temporary file onto", path_, err, "check that the directory is writable");
  }
}

}  // namespace pooch::xmc_io
