// libFuzzer target: the binary data-set cache (*.pcache, formats/xmc_cache.cpp),
// read by load_xmc whenever a cache sits beside a data file. The input is a
// cache file; the source it is keyed to is a small fixed bag-of-words file.
//
// Random bytes never match the cache's key and checksums, so the harness
// writes the source's key and recomputes the payload and header checksums
// (the 152-byte header of xmc_cache.cpp: key at 24, payload hash at 136,
// header hash at 144) before load_xmc reads it. A cache that is refused
// must fall back to the text (never an error); one that is used must hold
// a consistent data set.
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "formats/file_io.h"
#include "formats/xmc_text.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr char kSource[] = "3 4 2\n0 0:1 3:0.5\n1 1:2\n0,1 2:1 3:1\n";

const std::string& source_path() {
  static const std::string path = [] {
    const std::string p = pooch_fuzz::input_path(".txt");
    pooch_fuzz::write_input(p, reinterpret_cast<const uint8_t*>(kSource), sizeof kSource - 1);
    return p;
  }();
  return path;
}

void fix_key_and_checksums(std::vector<uint8_t>& b, const pooch::file_io::FileId& id) {
  constexpr size_t kHeader = 152, kKey = 24, kPayloadHash = 136, kHeaderHash = 144;
  if (b.size() < kHeader) return;
  const uint64_t key[4] = {id.size, static_cast<uint64_t>(id.mtime_ns), id.head_hash, id.tail_hash};
  std::memcpy(b.data() + kKey, key, sizeof key);
  const uint64_t payload = XXH3_64bits(b.data() + kHeader, b.size() - kHeader);
  std::memcpy(b.data() + kPayloadHash, &payload, 8);
  const uint64_t header = XXH3_64bits(b.data(), kHeaderHash);
  std::memcpy(b.data() + kHeaderHash, &header, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& src = source_path();
  std::vector<uint8_t> bytes(data, data + size);
  fix_key_and_checksums(bytes, pooch::file_io::file_id(src));
  const std::string cache = pooch_fuzz::input_path(".pcache");
  pooch_fuzz::write_input(cache, bytes.data(), bytes.size());
  pooch::LoadOptions o;
  o.cache_path = cache;
  o.write_cache = false;
  pooch::LoadInfo info;
  pooch::XmcDataset d;
  try {
    d = pooch::load_xmc(src, o, &info);
  } catch (const pooch::Error& e) {
    pooch_fuzz::finding(std::string("a bad cache failed the load instead of falling back: ") +
                        e.what());
  }
  if (const std::string bad = pooch::xmc_check(d); !bad.empty())
    pooch_fuzz::finding("load_xmc returned an inconsistent data set: " + bad);
  if (!info.from_cache && d.rows() != 3)
    pooch_fuzz::finding("the fallback to the text did not read the text");
  return 0;
}
