// libFuzzer target: the XMC bag-of-words text reader (parse_xmc_bow), the
// reader behind `pooch-run train --train FILE` and `--data DIR`.
// What it accepts must satisfy the CSR invariants (xmc_check) and write back
// out and read again to the same data set.
#include "formats/xmc_text.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pooch::XmcDataset d;
  try {
    d = pooch::parse_xmc_bow(pooch_fuzz::as_text(data, size), "fuzz.txt");
  } catch (const pooch::Error&) {
    return 0;  // refused with a message: fine
  }
  if (const std::string bad = pooch::xmc_check(d); !bad.empty())
    pooch_fuzz::finding("parse_xmc_bow accepted an inconsistent data set: " + bad);
  std::string again;
  try {
    again = pooch::format_xmc_bow(d);
  } catch (const pooch::Error& e) {
    pooch_fuzz::finding(std::string("format_xmc_bow refused what parse_xmc_bow accepted: ") +
                        e.what());
  }
  const pooch::XmcDataset back = pooch::parse_xmc_bow(again, "fuzz.txt (written back)");
  if (back.row_ptr != d.row_ptr || back.col != d.col || back.label_ptr != d.label_ptr ||
      back.label != d.label || back.features != d.features || back.labels != d.labels)
    pooch_fuzz::finding("write-then-read changed the data set");
  return 0;
}
