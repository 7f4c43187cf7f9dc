#include "formats/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>
#include <vector>

#include "formats/file_check.h"
#include "runtime/core/error.h"

namespace pooch::file_io {

namespace {

constexpr size_t kEdgeBytes = 64 * 1024;
constexpr std::align_val_t kHeapAlign{64};  // as a mapping's start, for data used in place
constexpr size_t kMaxIo = size_t{1} << 30;  // Linux moves at most about 2 GiB per call

[[noreturn]] void io_fail(const std::string& what, const std::string& path, int err,
                          const char* todo) {
  throw Error(POOCH_ERR_IO,
              fmt::format("cannot {} '{}': {}; {}", what, path, errno_text(err), todo));
}

}  // namespace

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

bool read_full(int fd, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, std::min(n, kMaxIo));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool pread_full(int fd, void* dst, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::min(n, kMaxIo), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

MappedFile::MappedFile(const std::string& path, const MapOptions& opts) {
  // Anything but a regular file whose size the system reports is refused
  // before a byte is read (file_check): a FIFO never blocks the open, a
  // device never streams until memory runs out, and every read is bounded
  // by the size announced.
  struct stat st {};
  Fd f;
  f.fd = file_check::open_regular(path, opts.what, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;  // mmap of length 0 fails; an empty view says it all
  if (opts.use_mmap) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (map_ != MAP_FAILED) {
      if (opts.sequential) ::madvise(map_, size_, MADV_SEQUENTIAL);
      data_ = static_cast<const std::byte*>(map_);
      return;
    }
    map_ = nullptr;  // a file system without mmap: fall through to read()
  }
  read_all(f.fd, path);
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(map_, size_);
  if (heap_) ::operator delete(heap_, kHeapAlign);
}

void MappedFile::grow(size_t cap, const std::string& path) {
  std::byte* p = nullptr;
  try {
    p = static_cast<std::byte*>(::operator new(cap, kHeapAlign));
  } catch (const std::bad_alloc&) {
    throw Error(POOCH_ERR_OUT_OF_MEMORY,
                fmt::format("cannot read '{}': {} bytes of memory to read it into are not "
                            "available",
                            path, cap));
  }
  if (heap_) {
    std::memcpy(p, heap_, size_);
    ::operator delete(heap_, kHeapAlign);
  }
  heap_ = p;
  heap_cap_ = cap;
}

void MappedFile::read_all(int fd, const std::string& path) {
  // A regular file: one buffer of its size, filled by as few calls as the OS allows.
  const size_t want = size_;
  size_ = 0;
  grow(want, path);
  while (size_ < want) {
    const ssize_t got =
        ::pread(fd, heap_ + size_, std::min(want - size_, kMaxIo), static_cast<off_t>(size_));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : 0;
      throw Error(
          POOCH_ERR_IO,
          fmt::format("cannot read '{}' at byte {}: {}; check the disk, or whether "
                      "another program is changing the file",
                      path, size_, err ? errno_text(err) : "the file shrank while reading"));
    }
    size_ += static_cast<size_t>(got);
  }
  data_ = heap_;
}

FileId file_id(const std::string& path) {
  struct stat st {};
  Fd f;
  f.fd = file_check::open_regular(path, "a data file", &st);
  FileId id;
  id.regular = true;
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
  // processes) of one target apart; O_EXCL never reuses a name another
  // writer holds, e.g. one left by a crashed process whose pid came back.
  static std::atomic<uint64_t> counter{0};
  // Temporaries of writers killed mid-write would otherwise stay for ever.
  const std::vector<std::string> stale = file_check::remove_stale_temporaries(path_);
  if (!stale.empty())
    file_check::note(
        fmt::format("removed {} temporary file{} of '{}' left by a process that no "
                    "longer exists ({}{})",
                    stale.size(), stale.size() == 1 ? "" : "s", path_, stale[0],
                    stale.size() == 1 ? "" : ", ..."));
  for (int attempt = 0;; ++attempt) {
    tmp_ = fmt::format("{}.tmp-{}-{}", path_, static_cast<long>(::getpid()), counter++);
    // Mode 0666 lets the umask decide permissions, as for any new file.
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    if (errno != EEXIST || attempt >= 100) fail("create");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!renamed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Loop for what one call cannot move and for short writes.
    const ssize_t put = ::write(fd_, p, std::min(n, kMaxIo));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      if (put == 0) errno = EIO;
      fail(fmt::format("write byte {} of", written_));
    }
    p += put;
    n -= static_cast<size_t>(put);
    written_ += static_cast<uint64_t>(put);
  }
}

void AtomicFile::commit() {
  // fsync before rename: otherwise a crash can leave the new name pointing
  // at a file whose data never reached the disk.
  if (::fsync(fd_) != 0) fail("fsync");
  const int fd = fd_;
  fd_ = -1;
  // close can report a deferred write error (NFS, quotas): it counts.
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    throw Error(POOCH_ERR_IO, fmt::format("cannot write '{}': renaming '{}' over it failed: {}; "
                                          "'{}' was left unchanged. Check that the path is not "
                                          "a directory and that its directory is writable",
                                          path_, tmp_, errno_text(err), path_));
  }
  renamed_ = true;
  // Without syncing the directory a crash can bring back the old entry.
  const size_t slash = path_.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = 0;
  if (dfd < 0) {
    err = errno;
  } else {
    if (::fsync(dfd) != 0) err = errno;
    ::close(dfd);
  }
  // Some file systems cannot sync a directory at all (EINVAL): nothing more can be done there.
  if (err != 0 && err != EINVAL && err != ENOTSUP)
    throw Error(POOCH_ERR_IO,
                fmt::format("'{}' was written, but syncing its directory '{}' failed: {}; the new "
                            "file may not survive a power failure. Check the disk and write it "
                            "again",
                            path_, dir, errno_text(err)));
}

void AtomicFile::fail(const std::string& step) {
  const int err = errno;
  throw Error(POOCH_ERR_IO, fmt::format("cannot write '{}': {} '{}' failed: {}; '{}' was left "
                                        "unchanged. Check that the directory exists and is "
                                        "writable and that the disk has space",
                                        path_, step, tmp_, errno_text(err), path_));
}

}  // namespace pooch::file_io
