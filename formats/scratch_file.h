// Bytes parked on disk instead of in memory: an unlinked temporary file in a
// chosen directory (so it disappears with the process, even one killed),
// appended to piece by piece and then mapped read-only. An importer converts
// a checkpoint larger than memory tensor by tensor into it, and the writer
// of the model file reads the converted tensors from the mapping (the page
// cache holds them, not the process).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pooch::file_io {

class ScratchFile {
 public:
  // A temporary file in `dir` ("" or "."; the current directory); `what`
  // names its purpose in messages. Error(POOCH_ERR_IO) when it cannot be made.
  ScratchFile(const std::string& dir, const std::string& what);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Appends n bytes; returns their offset. Not after map().
  uint64_t append(const void* data, size_t n);
  // Maps what was written; bytes(offset, n) are valid until destruction.
  void map();
  std::span<const std::byte> bytes(uint64_t offset, size_t n) const;
  uint64_t size() const { return size_; }

 private:
  std::string what_;
  int fd_ = -1;
  uint64_t size_ = 0;
  void* map_ = nullptr;
};

}  // namespace pooch::file_io
