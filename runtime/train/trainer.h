// The training loop over any session: epochs over a shuffled data order,
// learning-rate warm-up and reduce-on-plateau, evaluation after each epoch
// (an evaluation callback: each family has its own metrics), early stopping,
// and checkpoints from which a run resumes bit for bit (the state below is
// everything the loop itself carries). The XMC adapter (train_xmc) wires an
// XMC data set and P@k into it.
#pragma once
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../../formats/pooch_file.h"
#include "../../formats/xmc_data.h"
#include "../session/session.h"
#include "metrics.h"
#include "xmc_session.h"

namespace pooch {

struct TrainConfig {
  int epochs = 10;
  int64_t warmup_steps = 0;  // linear warm-up of the learning rate over these steps
  double plateau_factor = 0.5;  // multiply the learning rate by this ...
  int plateau_patience = 2;     // ... after this many epochs without improvement (0: never)
  int early_stop_patience = 4;  // stop after this many epochs without improvement (0: never)
  bool shuffle = true;
  uint64_t data_seed = 1;  // the data order of every epoch derives from it
  double psp_a = 0.55, psp_b = 1.5;
  std::string checkpoint_path;  // written after each epoch and when cancelled ("": never)
  // Dynamic sparse training of a fixed fan-in head (train_xmc): every this
  // many steps (0: never) the fraction rewire_fraction of each row's
  // connections with the smallest |w| is pruned and regrown at random.
  int64_t rewire_every = 0;
  double rewire_fraction = 0.1;
  // The training data's data_fingerprint, stored in every checkpoint ("": none).
  std::string data_fingerprint;
  // Training ends (as after its last epoch) once the optimizer has taken
  // this many steps in all, counted over resumes (0: epochs alone decide).
  int64_t max_steps = 0;
  // The learning-rate schedule: with `cosine`, warm-up over warmup_steps and
  // then half a cosine down to min_lr_ratio at the run's last step (max_steps,
  // else epochs x batches per epoch; lr_schedule.h); reduce-on-plateau still
  // multiplies it when its patience is nonzero.
  bool cosine = false;
  double min_lr_ratio = 0.1;
};

// What a checkpoint carries besides the tensors (metadata keys train.*).
struct TrainerState {
  int64_t epoch = 0;     // the epoch in progress (0-based)
  int64_t position = 0;  // batches of it already done
  double loss_sum = 0;   // of those batches
  double plateau_scale = 1;
  double best = -std::numeric_limits<double>::infinity();
  int bad_epochs = 0;   // epochs since the best, for early stopping
  int plateau_bad = 0;  // epochs since the best or the last reduction
  bool finished = false;
  std::string data_fingerprint;  // of the data the checkpoint trained on ("": not recorded)
};

void put_state(Metadata& m, const TrainerState& s, const TrainConfig& cfg);

// What identifies a training set: an xxh3-64 hash over its shape and every
// array (features, values, labels, dense rows), with the shape in words, e.g.
// "xxh3 5f0c5e2a91d3b7e4 (1000 rows, 5000 features, 3993 labels)". Two sets
// with the same fingerprint hold the same rows in the same order.
std::string data_fingerprint(const XmcDataset& d);
TrainerState get_state(const Metadata& m);  // Error POOCH_ERR_BAD_INPUT naming a missing key

// What an evaluation callback returns: the score the trainer maximises
// (plateau and early stopping) and the figures to report.
struct EvalResult {
  double score = 0;
  std::vector<std::pair<std::string, double>> metrics;
};

struct EpochReport {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  double seconds = 0;
  double lr = 0;
  bool evaluated = false;
  EvalResult eval;
  bool improved = false;
  bool reduced_lr = false;
  bool stopping = false;
};

struct TrainCallbacks {
  // After every step; return false to stop (a checkpoint is written first).
  std::function<bool(uint64_t step, float loss, int64_t epoch, int64_t batch, int64_t batches)>
      on_step;
  std::function<void(const EpochReport&)> on_epoch;
  // After every optimizer update, before on_step (the XMC adapter rewires
  // its fixed fan-in head here).
  std::function<void(uint64_t step)> after_update;
};

// The rows a session trains on, batch by batch.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t rows() const = 0;
  // Sets the session's inputs to rows order[first, first + n).
  virtual void load(const std::vector<int64_t>& order, int64_t first, int64_t n) = 0;
};

// Evaluates the session after an epoch.
using EvalFn = std::function<EvalResult()>;

// Runs (or resumes, from `state`) training: rows per step is the model's
// batch. Without `eval` the score is the negated training loss. Throws
// Error(POOCH_ERR_CANCELLED) when a callback or the session was cancelled,
// after writing the checkpoint.
void train(Session& s, BatchSource& data, const EvalFn& eval, const TrainConfig& cfg,
           TrainerState& state, const TrainCallbacks& cb);

// The XMC adapter: trains on an XMC data set, evaluating P@k, nDCG@k and
// PSP@k on `test_set` (may be null); the score is P@3. `last_eval` (may be
// null) receives the last evaluation's full metrics.
void train_xmc(XmcSession& s, const XmcDataset& train_set, const XmcDataset* test_set,
               const TrainConfig& cfg, TrainerState& state, const TrainCallbacks& cb,
               XmcMetricsResult* last_eval = nullptr);

// P@k, nDCG@k and (with propensities) PSP@k of the session's predictions.
XmcMetricsResult evaluate(XmcSession& s, const XmcDataset& d, const std::vector<double>* inv_prop);

// Label frequencies of a training set, for propensities.
std::vector<int64_t> label_counts(const XmcDataset& d);

// Rows [first, first + n) of `order` gathered into contiguous CSR buffers.
struct BatchBuffer {
  std::vector<int64_t> row_ptr, label_ptr;
  std::vector<int32_t> col, label;
  std::vector<float> val, dense;
  BatchView gather(const XmcDataset& d, const std::vector<int64_t>& order, int64_t first,
                   int64_t n);
};

}  // namespace pooch
