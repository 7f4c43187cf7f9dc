// File plumbing for every format in formats/ (the .pooch container, the XMC
// readers and writers, the data set cache): errno text, whole-file mapping,
// file identity for cache keys, and atomic, durable replacement of a file.
// Failures are Error(POOCH_ERR_IO) naming the path and what the OS said
// (POOCH_ERR_OUT_OF_MEMORY when a file must be read into memory that is not
// there).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pooch::file_io {

// "No such file or directory" and the like, for messages.
std::string errno_text(int err);

// A file descriptor closed when it goes out of scope (-1: none).
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
};

// Reads exactly n bytes at the file position (read_full) or at `offset`
// (pread_full), retrying short reads and EINTR. False on an error (errno
// says which) or when the file ends first (errno left as it was).
bool read_full(int fd, void* dst, size_t n);
bool pread_full(int fd, void* dst, size_t n, uint64_t offset);

struct MapOptions {
  bool use_mmap = true;              // false: read into memory even where mapping works
  bool sequential = false;           // the caller reads front to back once (a readahead hint)
  const char* what = "a data file";  // what the path should name, for messages
};

// The bytes of a whole file: mapped when it is a regular file (so a
// multi-GB file costs no copy), read into memory otherwise (a pipe,
// /dev/stdin, a file system that refuses mmap, or use_mmap false). Either
// way the bytes start 64-byte aligned and stay put while the object lives.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path, const MapOptions& opts = {});
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }
  bool mapped() const { return map_ != nullptr; }

 private:
  void read_all(int fd, const std::string& path);
  void grow(size_t cap, const std::string& path);

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;
  std::byte* heap_ = nullptr;
  size_t heap_cap_ = 0;
};

// What a cache is keyed by: a change to any of these means the file changed.
struct FileId {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t head_hash = 0;  // xxh3-64 of the first min(size, 64 KiB) bytes
  uint64_t tail_hash = 0;  // xxh3-64 of the last min(size, 64 KiB) bytes
  bool regular = false;    // only regular files can be keyed
  bool operator==(const FileId&) const = default;
};
FileId file_id(const std::string& path);

// Writes `path` atomically and durably: data go to a temporary file beside
// it (created exclusively, so no two writers share one), which commit()
// fsyncs, renames over `path` and makes the rename durable by syncing the
// directory. Readers see the old file or the whole new one, never a part; an
// uncommitted writer removes its temporary file. Failures name the target
// and say it was left unchanged.
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

}  // namespace pooch::file_io
