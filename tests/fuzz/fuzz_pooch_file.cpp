// libFuzzer target: the .pooch container reader (read_pooch_file), which
// every model and checkpoint passes through, and the model spec it carries.
//
// The header and each section carry an xxh3 checksum, which random bytes
// never match; so that the fuzzer reaches the decoders behind them, the
// harness recomputes the section and header checksums of every input long
// enough to have a header (at the offsets the input's own header gives, when
// they lie inside it) before the reader sees it. Tensor data checksums stay
// as they are: the reader is run with and without verifying them.
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "formats/pooch_file.h"
#include "runtime/core/error.h"
#include "runtime/models/model_spec.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

uint64_t u64_at(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}

// docs/FORMAT.md "Header": (offset, size) field pairs and their checksums.
void fix_checksums(std::vector<uint8_t>& b) {
  if (b.size() < pooch::kPoochHeaderBytes) return;
  struct Section {
    size_t off, size, sum;
  };
  const Section sections[] = {{24, 32, 88}, {40, 48, 96}, {56, 64, 104}};
  for (const Section& s : sections) {
    const uint64_t off = u64_at(b, s.off), n = u64_at(b, s.size);
    if (off > b.size() || n > b.size() - off) continue;
    const uint64_t h = XXH3_64bits(b.data() + off, n);
    std::memcpy(b.data() + s.sum, &h, 8);
  }
  const uint64_t h = XXH3_64bits(b.data(), 120);
  std::memcpy(b.data() + 120, &h, 8);
}

void read_all(const std::string& path, bool mmap, bool verify) {
  pooch::ReadOptions o;
  o.use_mmap = mmap;
  o.verify_data = verify;
  try {
    const pooch::PoochFile f = pooch::read_pooch_file(path, o);
    for (const pooch::TensorEntry& e : f.tensors()) {
      (void)f.data(e);
      try {
        f.verify(e);
      } catch (const pooch::Error&) {
      }
    }
    if (f.metadata().has(pooch::meta_keys::kModelSpec)) {
      try {
        (void)pooch::spec_from_json(f.metadata().get_string(pooch::meta_keys::kModelSpec),
                                    "fuzz.pooch (model.spec)");
      } catch (const pooch::Error&) {
      }
    }
  } catch (const pooch::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  fix_checksums(bytes);
  const std::string path = pooch_fuzz::input_path(".pooch");
  pooch_fuzz::write_input(path, bytes.data(), bytes.size());
  read_all(path, true, true);
  read_all(path, false, false);
  return 0;
}
