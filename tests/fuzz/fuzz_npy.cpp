// libFuzzer target: both .npy readers. The input is one .npy file:
//  - parse_xmc_npy, the dense features of an XMC split set (formats/), with a
//    labels file of one empty row per array row when the array parses;
//  - cli::read_npy, pooch-run's reader of dense rows and targets (apps/npy.cpp),
//    which takes a path.
#include "apps/npy.h"
#include "formats/xmc_text.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view npy = pooch_fuzz::as_text(data, size);
  try {
    // One label row per array row would need the row count first; "1 1" and
    // one row reaches the label parser for one-row arrays and tests the
    // row-count check for the rest.
    const pooch::XmcDataset d = pooch::parse_xmc_npy(npy, "fuzz.npy", "1 1\n0\n", "fuzz_Y.txt");
    if (const std::string bad = pooch::xmc_check(d); !bad.empty())
      pooch_fuzz::finding("parse_xmc_npy accepted an inconsistent data set: " + bad);
  } catch (const pooch::Error&) {
  }

  const std::string path = pooch_fuzz::input_path(".npy");
  pooch_fuzz::write_input(path, data, size);
  cli::NpyArray a;
  std::string error;
  if (cli::read_npy(path, &a, &error)) {
    // uint8 (images) included: the first 10-million run stopped on this
    // check written before read_npy took uint8, not on a reader's fault.
    const size_t item = a.type == cli::NpyType::u8                                   ? 1
                        : a.type == cli::NpyType::f32 || a.type == cli::NpyType::i32 ? 4
                                                                                     : 8;
    if (a.elements() < 0 || a.data.size() != static_cast<size_t>(a.elements()) * item)
      pooch_fuzz::finding("read_npy accepted an array whose data do not match its shape");
    if (a.is_float())
      (void)cli::npy_as_f32(a);
    else
      (void)cli::npy_as_i64(a);
  } else if (error.empty()) {
    pooch_fuzz::finding("read_npy refused an input without saying why");
  }
  return 0;
}
