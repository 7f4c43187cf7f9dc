// libFuzzer target: the XMC split-file readers (X_Xf.txt features and X_Y.txt
// labels, parse_xmc_split). One input holds both files, the features first,
// separated by a line "--labels--" (a separator line no valid file holds);
// without it the whole input is the features and the labels file is empty.
#include "formats/xmc_text.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all = pooch_fuzz::as_text(data, size);
  constexpr std::string_view kSep = "\n--labels--\n";
  const size_t at = all.find(kSep);
  const std::string_view features = at == std::string_view::npos ? all : all.substr(0, at);
  const std::string_view labels =
      at == std::string_view::npos ? std::string_view() : all.substr(at + kSep.size());
  try {
    const pooch::XmcDataset d =
        pooch::parse_xmc_split(features, "fuzz_Xf.txt", labels, "fuzz_Y.txt");
    if (const std::string bad = pooch::xmc_check(d); !bad.empty())
      pooch_fuzz::finding("parse_xmc_split accepted an inconsistent data set: " + bad);
  } catch (const pooch::Error&) {
  }
  return 0;
}
