#include "progress.h"

#include <algorithm>
#include <cstdio>

#include "console.h"

namespace cli {

Progress::Progress(bool tty, int epochs) : tty_(tty), epochs_(epochs) {}

void Progress::clear() {
  if (tty_ && bar_shown_) {
    say("\r\033[K");
    std::fflush(stdout);
  }
  bar_shown_ = false;
}

void Progress::step(int64_t step, float loss, int epoch, int64_t batch, int64_t batches) {
  const auto now = std::chrono::steady_clock::now();
  if (epoch != last_epoch_) {
    last_epoch_ = epoch;
    epoch_start_ = now;
    loss_sum_ = 0;
    loss_n_ = 0;
    last_line_batch_ = -1;
  }
  loss_sum_ += loss;
  ++loss_n_;
  const int64_t done = batch;
  // Steps per second since the epoch's first step (unknown until the second).
  const double secs = std::chrono::duration<double>(now - epoch_start_).count();
  const double rate = secs > 0 ? static_cast<double>(loss_n_ - 1) / secs : 0;
  char speed[48] = "-";
  if (rate > 0) std::snprintf(speed, sizeof speed, "%.1f", rate);
  const double mean = loss_sum_ / static_cast<double>(std::max<int64_t>(1, loss_n_));
  if (tty_) {
    if (done < batches && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const double frac = batches > 0 ? static_cast<double>(done) / static_cast<double>(batches) : 1;
    const int fill = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(fill), '=');
    if (fill < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    char eta[48] = "-";
    if (rate > 0)
      std::snprintf(eta, sizeof eta, "%.0f s", static_cast<double>(batches - done) / rate);
    say("\r\033[Kepoch %d/%d [%s] %lld/%lld  loss %.5f  %s steps/s  epoch eta %s", epoch, epochs_,
        bar.c_str(), static_cast<long long>(done), static_cast<long long>(batches), mean, speed,
        eta);
    std::fflush(stdout);
    bar_shown_ = true;
    return;
  }
  // Plain lines: about ten per epoch, and the first step of the run.
  const int64_t every = std::max<int64_t>(1, batches / 10);
  if (done % every != 0 && done != batches && step != 1) return;
  if (done == last_line_batch_) return;
  last_line_batch_ = done;
  say("epoch %d/%d  step %lld  batch %lld/%lld  loss %.5f  %s steps/s\n", epoch, epochs_,
      static_cast<long long>(step), static_cast<long long>(done), static_cast<long long>(batches),
      mean, speed);
  std::fflush(stdout);
}

std::string metrics_line(const pooch_metrics& m) {
  char buf[256];
  std::string s;
  std::snprintf(buf, sizeof buf, "P@1/3/5 %.2f %.2f %.2f  nDCG@1/3/5 %.2f %.2f %.2f",
                100 * m.precision[0], 100 * m.precision[2], 100 * m.precision[4], 100 * m.ndcg[0],
                100 * m.ndcg[2], 100 * m.ndcg[4]);
  s = buf;
  if (m.has_psp) {
    std::snprintf(buf, sizeof buf, "  PSP@1/3/5 %.2f %.2f %.2f", 100 * m.psp[0], 100 * m.psp[2],
                  100 * m.psp[4]);
    s += buf;
  }
  return s;
}

void Progress::epoch(const pooch_epoch_report& r) {
  clear();
  std::string flags;
  if (r.reduced_lr) flags += "  (learning rate reduced)";
  if (r.stopping) flags += "  (early stop)";
  say("epoch %d/%d  loss %.5f  %s  %.1f s  lr %.3g%s\n", r.epoch, epochs_, r.train_loss,
      r.evaluated ? metrics_line(r.eval).c_str() : "(no test set)", r.seconds, r.learning_rate,
      flags.c_str());
  std::fflush(stdout);
  last_epoch_ = -1;
}

void print_metrics_table(const pooch_metrics& m) {
  say("%-6s %8s %8s %8s %8s %8s\n", "", "@1", "@2", "@3", "@4", "@5");
  auto row = [](const char* name, const double* v) {
    say("%-6s %8.2f %8.2f %8.2f %8.2f %8.2f\n", name, 100 * v[0], 100 * v[1], 100 * v[2],
        100 * v[3], 100 * v[4]);
  };
  row("P", m.precision);
  row("nDCG", m.ndcg);
  if (m.has_psp) row("PSP", m.psp);
  std::fflush(stdout);
}

Json metrics_json(const pooch_metrics& m) {
  Json j;
  j["rows"] = m.rows;
  j["precision"] = Json::array();
  j["ndcg"] = Json::array();
  for (int k = 0; k < 5; ++k) {
    j["precision"].push_back(m.precision[k]);
    j["ndcg"].push_back(m.ndcg[k]);
  }
  if (m.has_psp) {
    j["psp"] = Json::array();
    for (int k = 0; k < 5; ++k) j["psp"].push_back(m.psp[k]);
  } else {
    j["psp"] = nullptr;
  }
  return j;
}

Json epoch_json(const pooch_epoch_report& r) {
  Json j;
  j["epoch"] = r.epoch;
  j["loss"] = r.train_loss;
  j["seconds"] = r.seconds;
  j["lr"] = tidy(static_cast<float>(r.learning_rate));
  j["improved"] = r.improved != 0;
  j["reduced_lr"] = r.reduced_lr != 0;
  j["stopping"] = r.stopping != 0;
  if (r.evaluated) j["eval"] = metrics_json(r.eval);
  return j;
}

}  // namespace cli
