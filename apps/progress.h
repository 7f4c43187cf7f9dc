// Training progress on stdout: a bar redrawn in place on a terminal, plain
// lines (about ten per epoch) otherwise; one line per epoch with the loss,
// P@1/3/5, nDCG@1/3/5, PSP@1/3/5 and the seconds it took; and the metrics
// table of `eval`.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "cli_common.h"

namespace cli {

class Progress {
 public:
  // `tty`: draw a bar (isatty(stdout)); `epochs`: the planned number.
  Progress(bool tty, int epochs);
  // After each step; `epoch` is 1-based, `batch` counts the epoch's batches done.
  void step(int64_t step, float loss, int epoch, int64_t batch, int64_t batches);
  void epoch(const pooch_epoch_report& r);
  // Ends a bar line in progress (before printing anything else).
  void clear();

 private:
  bool tty_;
  int epochs_;
  bool bar_shown_ = false;
  int64_t last_line_batch_ = -1;
  int last_epoch_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point epoch_start_{};
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
};

// "P@1/3/5 45.10 30.22 21.05" etc.
std::string metrics_line(const pooch_metrics& m);
void print_metrics_table(const pooch_metrics& m);
Json metrics_json(const pooch_metrics& m);
Json epoch_json(const pooch_epoch_report& r);

}  // namespace cli
