// pooch-run: the command line tool. Built on the public C API alone
// (pooch.h), as dav1d's CLI uses only dav1d.h.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "pooch/pooch.h"

namespace {

// Exit codes shared by every subcommand.
enum Exit { kOk = 0, kUsage = 1, kBadInput = 2, kOutOfBudget = 3, kInternal = 4 };

int exit_code(pooch_status st) {
  switch (st) {
    case POOCH_OK:
      return kOk;
    case POOCH_ERR_INVALID_ARG:
    case POOCH_ERR_NO_DEVICE:
    case POOCH_ERR_UNSUPPORTED:
      return kUsage;
    case POOCH_ERR_BAD_INPUT:
    case POOCH_ERR_IO:
      return kBadInput;
    case POOCH_ERR_OUT_OF_BUDGET:
      return kOutOfBudget;
    default:
      return kInternal;
  }
}

int report(pooch_status st, const char* what) {
  std::fprintf(stderr, "pooch-run: %s: %s: %s\n", what, pooch_status_str(st), pooch_last_error());
  return exit_code(st);
}

struct DemoOptions {
  int64_t rows = 4096, features = 2000, labels = 500;
  int64_t hidden = 128, fan_in = 16, batch = 64;
  int epochs = 5;
  int threads = 0;
  float lr = 1e-2f;
  uint64_t seed = 1;
  std::string device = "auto";
  double device_memory_mib = 0;
};

// The main job until data sets arrive: train sparse input -> linear -> relu
// -> fixed fan-in head -> BCE on a planted problem and print the loss.
int run_demo(const DemoOptions& o) {
  pooch_planted_params dp;
  pooch_planted_default_params(&dp);
  // A fifth more rows than trained on: the extra rows are held out for P@1.
  const int64_t test_rows = o.rows / 4;
  dp.rows = o.rows + test_rows;
  dp.features = o.features;
  dp.labels = o.labels;
  dp.seed = o.seed;
  pooch_dataset* ds = nullptr;
  if (pooch_status st = pooch_dataset_create_planted(&dp, &ds)) return report(st, "data");

  pooch_xmc_params mp;
  pooch_xmc_default_params(&mp);
  mp.features = o.features;
  mp.labels = o.labels;
  mp.hidden = o.hidden;
  mp.fan_in = o.fan_in;
  mp.batch_size = o.batch;
  mp.seed = o.seed;
  pooch_model* model = nullptr;
  pooch_session* sess = nullptr;
  int rc = kOk;
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.threads = o.threads;
  sp.learning_rate = o.lr;
  sp.device = o.device == "cpu"    ? POOCH_DEVICE_CPU
              : o.device == "cuda" ? POOCH_DEVICE_CUDA
                                   : POOCH_DEVICE_AUTO;
  sp.device_memory = static_cast<size_t>(o.device_memory_mib * 1024 * 1024);
  if (pooch_status st = pooch_model_create_xmc(&mp, &model)) {
    rc = report(st, "model");
  } else if (pooch_status st2 = pooch_session_create(model, &sp, &sess)) {
    rc = report(st2, "session");
  } else {
    pooch_memory_report mem;
    pooch_session_memory(sess, &mem);
    std::printf(
        "demo: %lld rows, %lld features, %lld labels; hidden %lld, fan-in %lld, batch %lld\n",
        static_cast<long long>(o.rows), static_cast<long long>(o.features),
        static_cast<long long>(o.labels), static_cast<long long>(o.hidden),
        static_cast<long long>(o.fan_in), static_cast<long long>(o.batch));
    std::printf(
        "arena: %.2f MiB on the %s backend (weights %.2f, activations %.2f, gradients %.2f, "
        "optimizer %.2f MiB)\n",
        mem.arena_bytes / 1048576.0, mem.backend, mem.by_role[1] / 1048576.0,
        mem.by_role[2] / 1048576.0, mem.by_role[3] / 1048576.0, mem.by_role[4] / 1048576.0);
    const auto t0 = std::chrono::steady_clock::now();
    int64_t step = 0;
    for (int e = 0; e < o.epochs && rc == kOk; ++e)
      for (int64_t first = 0; first < o.rows; first += o.batch) {
        pooch_batch b;
        pooch_dataset_batch(ds, first, std::min(o.batch, o.rows - first), &b);
        float loss = 0;
        if (pooch_status st = pooch_session_step(sess, &b, &loss)) {
          rc = report(st, "step");
          break;
        }
        std::printf("epoch %d step %lld loss %.6f\n", e + 1, static_cast<long long>(++step), loss);
      }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rc == kOk) {
      // Precision@1 on held-out rows: the planted labels are learnable.
      int64_t hits = 0;
      std::vector<int32_t> top(static_cast<size_t>(o.batch));
      for (int64_t first = o.rows; first < o.rows + test_rows; first += o.batch) {
        pooch_batch b;
        pooch_dataset_batch(ds, first, o.batch, &b);
        if (pooch_status st = pooch_session_predict(sess, &b, 1, top.data(), nullptr)) {
          rc = report(st, "predict");
          break;
        }
        for (int64_t r = 0; r < b.rows; ++r)
          for (int64_t j = b.label_ptr[r]; j < b.label_ptr[r + 1]; ++j)
            if (b.label[j] == top[static_cast<size_t>(r)]) ++hits;
      }
      std::printf(
          "trained %lld steps in %.2f s; P@1 on %lld held-out rows: %.2f%%\n",
          static_cast<long long>(step), secs, static_cast<long long>(test_rows),
          100.0 * static_cast<double>(hits) / static_cast<double>(std::max<int64_t>(1, test_rows)));
    }
  }
  pooch_session_free(&sess);
  pooch_model_free(&model);
  pooch_dataset_free(&ds);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pooch-run: train and run neural networks larger than the GPU they run on"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(pooch_version_str()));

  DemoOptions demo;
  CLI::App* d = app.add_subcommand(
      "demo", "Train a small model on a planted problem, printing the loss per step");
  d->add_option("--rows", demo.rows, "Training rows")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--features", demo.features, "Input width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--labels", demo.labels, "Output width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--hidden", demo.hidden, "Hidden width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--fan-in", demo.fan_in, "Inputs per label (0: dense head)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  d->add_option("--batch", demo.batch, "Rows per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--epochs", demo.epochs, "Passes over the data")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--lr", demo.lr, "Adam learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  d->add_option("--seed", demo.seed, "Data and weight seed")->capture_default_str();
  d->add_option("--threads", demo.threads, "CPU threads (0: all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  d->add_option("--device", demo.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  d->add_option("--device-memory", demo.device_memory_mib, "Device budget in MiB (0: no cap)")
      ->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }
  if (*d) return run_demo(demo);
  return kUsage;
}
