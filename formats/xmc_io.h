// File plumbing shared inside formats/ (the XMC readers, writers and cache,
// and the .pooch writer): whole-file mapping, file identity for cache keys,
// and atomic replacement of a file.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace pooch::xmc_io {

// "No such file or directory" and the like, for messages.
std::string errno_text(int err);

// The bytes of a file: mmapped when it is a regular file (so a multi-GB data
// set costs no copy), read into memory otherwise (a pipe, /dev/stdin).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error(POOCH_ERR_IO)
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {data_, size_}; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;
  std::string buf_;
};

// What a cache is keyed by: a change to any of these means the text changed.
struct FileId {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t head_hash = 0;  // xxh3-64 of the first min(size, 64 KiB) bytes
  uint64_t tail_hash = 0;  // xxh3-64 of the last min(size, 64 KiB) bytes
  bool regular = false;    // only regular files can be keyed
  bool operator==(const FileId&) const = default;
};
FileId file_id(const std::string& path);  // throws Error(POOCH_ERR_IO)

// Writes `path` atomically and durably: data go to a temporary file beside
// it (created exclusively, so no two writers share one), which commit()
// fsyncs, renames over `path` and makes the rename durable by syncing the
// directory. Readers see the old file or the whole new one, never a part; an
// uncommitted writer removes its temporary file. Failures are
// Error(POOCH_ERR_IO) naming the target and saying it was left unchanged.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();
  uint64_t written() const { return written_; }

 private:
  [[noreturn]] void fail(const std::string& step);

  std::string path_, tmp_;
  int fd_ = -1;
  bool renamed_ = false;
  uint64_t written_ = 0;
};

}  // namespace pooch::xmc_io
