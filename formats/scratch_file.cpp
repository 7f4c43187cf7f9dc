#include "formats/scratch_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "formats/file_io.h"
#include "runtime/core/error.h"

namespace pooch::file_io {

ScratchFile::ScratchFile(const std::string& dir, const std::string& what) : what_(what) {
  const std::string d = dir.empty() ? "." : dir;
  // O_TMPFILE: a file with no name at all; where the file system lacks it,
  // a named one unlinked at once.
  fd_ = ::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    std::string tmpl = d + "/.pooch-scratch-XXXXXX";
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ >= 0) ::unlink(tmpl.c_str());
  }
  if (fd_ < 0)
    throw Error(POOCH_ERR_IO,
                fmt::format("cannot create a temporary file in '{}' for {}: {}; check that the "
                            "directory exists and is writable",
                            d, what_, errno_text(errno)));
}

ScratchFile::~ScratchFile() {
  if (map_) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

uint64_t ScratchFile::append(const void* data, size_t n) {
  POOCH_CHECK(map_ == nullptr, "(appending to a mapped scratch file)");
  const uint64_t at = size_;
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    const ssize_t put = ::pwrite(fd_, p, left, static_cast<off_t>(size_ + (n - left)));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0)
      throw Error(POOCH_ERR_IO,
                  fmt::format("cannot write {} bytes of {} to a temporary file: {}; check the "
                              "disk has space",
                              n, what_, errno_text(put < 0 ? errno : EIO)));
    p += put;
    left -= static_cast<size_t>(put);
  }
  size_ += n;
  return at;
}

void ScratchFile::map() {
  if (map_ || size_ == 0) return;
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw Error(POOCH_ERR_IO, fmt::format("cannot map the temporary file of {} ({} bytes): {}",
                                          what_, size_, errno_text(errno)));
  }
}

std::span<const std::byte> ScratchFile::bytes(uint64_t offset, size_t n) const {
  POOCH_CHECK((map_ || n == 0) && offset + n <= size_, "(scratch bytes in range and mapped)");
  if (n == 0) return {};
  return {static_cast<const std::byte*>(map_) + offset, n};
}

}  // namespace pooch::file_io
