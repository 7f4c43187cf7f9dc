// The binary cache beside a data set's text: a fixed header (keys of the
// source files, counts, hashes) followed by the CSR arrays as raw
// little-endian bytes, so a load is a few large read() calls. Nothing in it is
// trusted: every size is checked against the file's length, the payload
// against its xxh3 hash, and the result against the CSR invariants before
// use; any failure falls back to the text.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "formats/file_io.h"
#include "formats/xmc_text.h"
#include "runtime/core/error.h"

namespace pooch {

namespace {

constexpr char kMagic[8] = {'P', 'X', 'M', 'C', 'A', 'C', 'H', 'E'};
// Bump when the layout or the parser's output changes (e.g. how duplicates
// are merged), so that old caches are rebuilt rather than misread.
constexpr uint32_t kVersion = 1;
constexpr uint32_t kEndian = 0x01020304;

enum class Kind : uint32_t { Bow = 1, SplitText = 2, SplitNpy = 3 };

struct SourceKey {
  uint64_t size, mtime_ns, head_hash, tail_hash;
};

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t endian;  // written natively: a cache from a big-endian host reads as a mismatch
  uint32_t kind;
  uint32_t nsources;
  SourceKey src[2];
  int64_t features, labels, rows, nnz, nlabel, dense_dim;
  uint64_t payload_hash;  // xxh3-64 over all arrays, in file order
  uint64_t header_hash;   // xxh3-64 over every header byte before this field
};
static_assert(sizeof(CacheHeader) == 152, "the cache header must have no padding");

SourceKey key_of(const file_io::FileId& id) {
  return {id.size, static_cast<uint64_t>(id.mtime_ns), id.head_hash, id.tail_hash};
}

// The array sizes in bytes, in file order, or nullopt when the counts are
// negative or their total overflows.
std::optional<std::vector<uint64_t>> array_bytes(const CacheHeader& h) {
  if (h.rows < 0 || h.nnz < 0 || h.nlabel < 0 || h.dense_dim < 0) return std::nullopt;
  const auto r = static_cast<unsigned __int128>(h.rows);
  const unsigned __int128 sizes[] = {(r + 1) * 8,
                                     (r + 1) * 8,
                                     static_cast<unsigned __int128>(h.nnz) * 4,
                                     static_cast<unsigned __int128>(h.nnz) * 4,
                                     static_cast<unsigned __int128>(h.nlabel) * 4,
                                     r * static_cast<unsigned __int128>(h.dense_dim) * 4};
  std::vector<uint64_t> out;
  unsigned __int128 total = 0;
  for (auto s : sizes) {
    total += s;
    if (total > (static_cast<unsigned __int128>(1) << 62)) return std::nullopt;
    out.push_back(static_cast<uint64_t>(s));
  }
  return out;
}

// Reads the cache when it is valid for `ids`; otherwise returns nullopt and,
// when a cache file exists but is unusable, says why in `note`.
std::optional<XmcDataset> read_cache(const std::string& path, Kind kind,
                                     const std::vector<file_io::FileId>& ids, std::string& note) {
  file_io::Fd f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));  // a FIFO must not block
  if (f.fd < 0) {
    if (errno != ENOENT)
      note = fmt::format("cache '{}' not read: {}", path, file_io::errno_text(errno));
    return std::nullopt;
  }
  const auto reject = [&](const char* why) {
    note = fmt::format("cache '{}' ignored: {}; the text is read instead", path, why);
    return std::nullopt;
  };
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) return reject("not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  CacheHeader h{};
  if (file_size < sizeof h || !file_io::read_full(f.fd, &h, sizeof h))
    return reject("truncated header");
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return reject("not a pooch cache file");
  if (h.version != kVersion || h.endian != kEndian)
    return reject("written by another version of pooch or another byte order");
  if (h.header_hash != XXH3_64bits(&h, offsetof(CacheHeader, header_hash)))
    return reject("the header is corrupt");
  if (h.kind != static_cast<uint32_t>(kind) || h.nsources != ids.size())
    return reject("it was made from another kind of source");
  for (size_t i = 0; i < ids.size(); ++i) {
    const SourceKey k = key_of(ids[i]);
    if (std::memcmp(&k, &h.src[i], sizeof k) != 0)
      return reject("the source file changed since it was written");
  }
  const auto sizes = array_bytes(h);
  if (!sizes) return reject("its counts are impossible");
  uint64_t total = sizeof h;
  for (uint64_t s : *sizes) total += s;
  if (total != file_size) return reject("its length does not match its counts (truncated?)");

  XmcDataset d;
  d.features = h.features;
  d.labels = h.labels;
  d.dense_dim = h.dense_dim;
  d.row_ptr.resize(static_cast<size_t>(h.rows) + 1);
  d.label_ptr.resize(static_cast<size_t>(h.rows) + 1);
  d.col.resize(static_cast<size_t>(h.nnz));
  d.val.resize(static_cast<size_t>(h.nnz));
  d.label.resize(static_cast<size_t>(h.nlabel));
  d.dense.resize((*sizes)[5] / 4);
  void* const dst[] = {d.row_ptr.data(), d.label_ptr.data(), d.col.data(),
                       d.val.data(),     d.label.data(),     d.dense.data()};
  XXH3_state_t* state = XXH3_createState();
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  bool ok = true;
  for (size_t i = 0; i < 6 && ok; ++i) {
    ok = file_io::read_full(f.fd, dst[i], (*sizes)[i]);
    if (ok) XXH3_64bits_update(state, dst[i], (*sizes)[i]);
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!ok) return reject("it could not be read to the end");
  if (hash != h.payload_hash) return reject("its data is corrupt (checksum mismatch)");
  const std::string bad = xmc_check(d);
  if (!bad.empty()) return reject(("its data is inconsistent: " + bad).c_str());
  return d;
}

void write_cache(const std::string& path, Kind kind, const std::vector<file_io::FileId>& ids,
                 const XmcDataset& d) {
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.endian = kEndian;
  h.kind = static_cast<uint32_t>(kind);
  h.nsources = static_cast<uint32_t>(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) h.src[i] = key_of(ids[i]);
  h.features = d.features;
  h.labels = d.labels;
  h.rows = d.rows();
  h.nnz = static_cast<int64_t>(d.col.size());
  h.nlabel = static_cast<int64_t>(d.label.size());
  h.dense_dim = d.dense_dim;
  const std::pair<const void*, size_t> arrays[] = {
      {d.row_ptr.data(), d.row_ptr.size() * 8}, {d.label_ptr.data(), d.label_ptr.size() * 8},
      {d.col.data(), d.col.size() * 4},         {d.val.data(), d.val.size() * 4},
      {d.label.data(), d.label.size() * 4},     {d.dense.data(), d.dense.size() * 4}};
  XXH3_state_t* state = XXH3_createState();
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  for (const auto& [p, n] : arrays) XXH3_64bits_update(state, p, n);
  h.payload_hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  h.header_hash = XXH3_64bits(&h, offsetof(CacheHeader, header_hash));
  file_io::AtomicFile f(path);
  f.write(&h, sizeof h);
  for (const auto& [p, n] : arrays) f.write(p, n);
  f.commit();
}

template <class Parse>
XmcDataset load_cached(const std::vector<std::string>& sources, Kind kind, const LoadOptions& opts,
                       LoadInfo* info, Parse&& parse) {
  LoadInfo local;
  LoadInfo& inf = info ? *info : local;
  inf = LoadInfo{};
  inf.cache_path = opts.cache_path.empty() ? sources[0] + ".pcache" : opts.cache_path;
  std::vector<file_io::FileId> ids;
  bool keyable = true;
  for (const auto& s : sources) {
    ids.push_back(file_io::file_id(s));
    keyable = keyable && ids.back().regular;
  }
  if (!keyable) {
    inf.cache_note = "a source is not a regular file, so it has no cache";
    return parse();
  }
  // A cache path that names a source would overwrite the data set itself.
  struct stat cache_st {};
  if (::stat(inf.cache_path.c_str(), &cache_st) == 0)
    for (const auto& src : sources) {
      struct stat st {};
      if (::stat(src.c_str(), &st) == 0 && st.st_dev == cache_st.st_dev &&
          st.st_ino == cache_st.st_ino)
        throw Error(POOCH_ERR_INVALID_ARG,
                    fmt::format("the cache path '{}' is the data file '{}' itself; choose another "
                                "cache path",
                                inf.cache_path, src));
    }
  if (opts.use_cache) {
    if (auto d = read_cache(inf.cache_path, kind, ids, inf.cache_note)) {
      inf.from_cache = true;
      return std::move(*d);
    }
  }
  XmcDataset d = parse();
  if (!opts.write_cache) return d;
  // A source rewritten while it was parsed may have given a mix of old and
  // new; keying a cache to that would make the mix permanent.
  for (size_t i = 0; i < sources.size(); ++i)
    if (!(file_io::file_id(sources[i]) == ids[i])) {
      inf.cache_note = fmt::format("'{}' changed while it was read; no cache written", sources[i]);
      return d;
    }
  try {
    write_cache(inf.cache_path, kind, ids, d);
    inf.cache_written = true;
  } catch (const Error& e) {
    // A read-only data directory must not stop training: note it and go on.
    if (!inf.cache_note.empty()) inf.cache_note += "; ";
    inf.cache_note += fmt::format("cache not written: {}", e.what());
  }
  return d;
}

}  // namespace

XmcDataset load_xmc(const std::string& path, const LoadOptions& opts, LoadInfo* info) {
  return load_cached({path}, Kind::Bow, opts, info, [&] { return read_xmc_bow(path); });
}

XmcDataset load_xmc_split(const std::string& features_path, const std::string& labels_path,
                          const LoadOptions& opts, LoadInfo* info) {
  // Which parser read the features is part of the key, so a .npy replaced by
  // a text file of the same name can never be answered from the old cache.
  Kind kind = Kind::SplitText;
  {
    file_io::Fd f(::open(features_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));  // a FIFO must not block
    struct stat st {};
    char magic[6];
    // Only a regular file is sniffed: reading a pipe here would eat its
    // start, and a pipe is never cached anyway.
    if (f.fd >= 0 && ::fstat(f.fd, &st) == 0 && S_ISREG(st.st_mode) &&
        file_io::pread_full(f.fd, magic, 6, 0) && std::memcmp(magic, "\x93NUMPY", 6) == 0)
      kind = Kind::SplitNpy;
  }
  return load_cached({features_path, labels_path}, kind, opts, info,
                     [&] { return read_xmc_split(features_path, labels_path); });
}

}  // namespace pooch
