#include "trainer.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "../core/error.h"
#include "lr_schedule.h"
#include "model_io.h"
#include "rewire.h"

namespace pooch {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The data order of an epoch depends only on (seed, epoch): a resumed run
// regenerates it and skips the batches already done.
std::vector<int64_t> epoch_order(int64_t rows, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  uint64_t x = seed * 0x100000001B3ull + static_cast<uint64_t>(epoch);
  for (int64_t i = rows - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// The factor for the update after `step` updates (the optimizer step about
// to be taken is step + 1); `total` is the run's last step, for the cosine.
double lr_scale_at(const TrainConfig& cfg, const TrainerState& st, uint64_t step, uint64_t total) {
  if (cfg.cosine)
    return cosine_lr_scale(step + 1, static_cast<uint64_t>(cfg.warmup_steps), total,
                           cfg.min_lr_ratio) *
           st.plateau_scale;
  double warm = 1.0;
  if (cfg.warmup_steps > 0)
    warm = std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps));
  return warm * st.plateau_scale;
}

void checkpoint(Session& s, const TrainConfig& cfg, const TrainerState& st,
                const OptimizerConfig& opt) {
  if (cfg.checkpoint_path.empty()) return;
  Metadata m;
  put_state(m, st, cfg);
  m.set_string(meta_keys::kOptimizer, optimizer_to_json(opt));
  save_session(s, cfg.checkpoint_path, true, m);
}

}  // namespace

void put_state(Metadata& m, const TrainerState& s, const TrainConfig& cfg) {
  m.set_i64(meta_keys::kEpoch, s.epoch);
  m.set_i64(meta_keys::kDataPosition, s.position);
  m.set_u64(meta_keys::kDataSeed, cfg.data_seed);
  m.set_f64(meta_keys::kLossSum, s.loss_sum);
  m.set_f64_array(meta_keys::kLrScheduleState,
                  {s.plateau_scale, s.best, static_cast<double>(s.bad_epochs),
                   static_cast<double>(s.plateau_bad)});
  m.set_bool(meta_keys::kFinished, s.finished);
  if (!cfg.data_fingerprint.empty())
    m.set_string(meta_keys::kDataFingerprint, cfg.data_fingerprint);
}

TrainerState get_state(const Metadata& m) {
  TrainerState s;
  s.epoch = m.get_i64(meta_keys::kEpoch);
  s.position = m.get_i64(meta_keys::kDataPosition);
  s.loss_sum = m.get_f64(meta_keys::kLossSum);
  const auto& lr = m.get_f64_array(meta_keys::kLrScheduleState);
  if (lr.size() != 4)
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("checkpoint: '{}' must hold 4 numbers, it holds {}",
                            meta_keys::kLrScheduleState, lr.size()));
  s.plateau_scale = lr[0];
  s.best = lr[1];
  s.bad_epochs = static_cast<int>(lr[2]);
  s.plateau_bad = static_cast<int>(lr[3]);
  s.finished = m.get_bool(meta_keys::kFinished);
  // Checkpoints written before fingerprints were recorded have none.
  if (m.has(meta_keys::kDataFingerprint))
    s.data_fingerprint = m.get_string(meta_keys::kDataFingerprint);
  return s;
}

std::string data_fingerprint(const XmcDataset& d) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  const int64_t shape[] = {d.rows(), d.features, d.labels, d.dense_dim};
  XXH3_64bits_update(st, shape, sizeof shape);
  const auto add = [&](const auto& v) {
    // Each array's length goes in too, so that bytes moved from one array to
    // the next cannot give the same hash.
    const uint64_t n = v.size();
    XXH3_64bits_update(st, &n, sizeof n);
    if (n) XXH3_64bits_update(st, v.data(), n * sizeof v[0]);
  };
  add(d.row_ptr);
  add(d.col);
  add(d.val);
  add(d.label_ptr);
  add(d.label);
  add(d.dense);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fmt::format("xxh3 {:016x} ({} rows, {} {}features, {} labels)", h, d.rows(), d.features,
                     d.has_dense() ? "dense " : "", d.labels);
}

std::vector<int64_t> label_counts(const XmcDataset& d) {
  std::vector<int64_t> c(static_cast<size_t>(d.labels), 0);
  for (int32_t l : d.label) ++c[static_cast<size_t>(l)];
  return c;
}

BatchView BatchBuffer::gather(const XmcDataset& d, const std::vector<int64_t>& order, int64_t first,
                              int64_t n) {
  row_ptr.assign(1, 0);
  label_ptr.assign(1, 0);
  col.clear();
  val.clear();
  label.clear();
  dense.clear();
  for (int64_t i = first; i < first + n; ++i) {
    const auto r = static_cast<size_t>(order[static_cast<size_t>(i)]);
    if (d.has_dense()) {
      const auto D = static_cast<size_t>(d.dense_dim);
      dense.insert(dense.end(), d.dense.begin() + static_cast<long>(r * D),
                   d.dense.begin() + static_cast<long>((r + 1) * D));
    } else {
      col.insert(col.end(), d.col.begin() + d.row_ptr[r], d.col.begin() + d.row_ptr[r + 1]);
      val.insert(val.end(), d.val.begin() + d.row_ptr[r], d.val.begin() + d.row_ptr[r + 1]);
    }
    row_ptr.push_back(static_cast<int64_t>(col.size()));
    label.insert(label.end(), d.label.begin() + d.label_ptr[r],
                 d.label.begin() + d.label_ptr[r + 1]);
    label_ptr.push_back(static_cast<int64_t>(label.size()));
  }
  BatchView b;
  b.rows = n;
  b.dense = dense.empty() ? nullptr : dense.data();
  b.row_ptr = row_ptr.data();
  b.col = col.data();
  b.val = val.data();
  b.label_ptr = label_ptr.data();
  b.label = label.data();
  return b;
}

XmcMetricsResult evaluate(XmcSession& s, const XmcDataset& d, const std::vector<double>* inv_prop) {
  const ModelSpec& spec = s.spec();
  if (d.labels > spec.labels || (d.has_dense() ? d.dense_dim : d.features) != spec.input_width)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the data set has {} features and {} labels; the model takes {} and {}",
                            d.has_dense() ? d.dense_dim : d.features, d.labels, spec.input_width,
                            spec.labels));
  const int k = std::min(5, spec.run.topk);
  XmcMetrics metrics(spec.labels, 5, inv_prop);
  std::vector<int64_t> order(static_cast<size_t>(d.rows()));
  std::iota(order.begin(), order.end(), 0);
  BatchBuffer buf;
  const int64_t batch = spec.run.batch;
  std::vector<int32_t> top(static_cast<size_t>(batch * k));
  for (int64_t first = 0; first < d.rows(); first += batch) {
    const int64_t n = std::min(batch, d.rows() - first);
    const BatchView b = buf.gather(d, order, first, n);
    s.predict(b, k, top.data(), nullptr);
    for (int64_t r = 0; r < n; ++r)
      metrics.add_row(top.data() + r * k, k, b.label + b.label_ptr[r],
                      b.label_ptr[r + 1] - b.label_ptr[r]);
  }
  return metrics.result();
}

void train_xmc(XmcSession& xs, const XmcDataset& train_set, const XmcDataset* test_set,
               const TrainConfig& cfg, TrainerState& st, const TrainCallbacks& cb,
               XmcMetricsResult* last_eval) {
  const ModelSpec& spec = xs.spec();
  const int64_t in_width = train_set.has_dense() ? train_set.dense_dim : train_set.features;
  if (in_width != spec.input_width || train_set.labels > spec.labels)
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the training set has {} features and {} labels; the model takes {} "
                            "and {}",
                            in_width, train_set.labels, spec.input_width, spec.labels));
  if ((spec.input == InputKind::dense) != train_set.has_dense())
    throw Error(POOCH_ERR_INVALID_ARG,
                fmt::format("the model takes {} input but the training set is {}",
                            spec.input == InputKind::dense ? "dense" : "sparse",
                            train_set.has_dense() ? "dense (.npy)" : "sparse (bag of words)"));
  std::vector<double> inv_prop;
  if (test_set)
    inv_prop = inverse_propensities(label_counts(train_set), std::max<int64_t>(1, train_set.rows()),
                                    cfg.psp_a, cfg.psp_b);
  // The spec may have more labels than this set names (finetuning keeps a head).
  inv_prop.resize(test_set ? static_cast<size_t>(spec.labels) : 0, 1.0);

  struct Source : BatchSource {
    XmcSession& xs;
    const XmcDataset& d;
    BatchBuffer buf;
    Source(XmcSession& x, const XmcDataset& data) : xs(x), d(data) {}
    int64_t rows() const override { return d.rows(); }
    void load(const std::vector<int64_t>& order, int64_t first, int64_t n) override {
      xs.stage(buf.gather(d, order, first, n), true);
    }
  } source(xs, train_set);
  EvalFn eval;
  if (test_set)
    eval = [&] {
      const XmcMetricsResult m = evaluate(xs, *test_set, &inv_prop);
      if (last_eval) *last_eval = m;
      EvalResult r;
      r.score = m.precision_at(3);
      for (int k = 1; k <= 5; ++k)
        r.metrics.emplace_back(fmt::format("P@{}", k), m.precision_at(k));
      return r;
    };
  TrainCallbacks callbacks = cb;
  if (cfg.rewire_every > 0) {
    if (!xs.session().graph().find("head.index"))
      throw Error(POOCH_ERR_INVALID_ARG,
                  "rewiring needs a fixed fan-in head; this model's output layer is dense");
    callbacks.after_update = [&](uint64_t step) {
      if (step % static_cast<uint64_t>(cfg.rewire_every) == 0)
        rewire_fixed_fan_in(xs.session(), "head.index", "head.weight", cfg.rewire_fraction,
                            xs.spec().seed, step);
    };
  }
  train(xs.session(), source, eval, cfg, st, callbacks);
}

void train(Session& s, BatchSource& data, const EvalFn& eval, const TrainConfig& cfg,
           TrainerState& st, const TrainCallbacks& cb) {
  const Model& model = s.model();
  if (model.losses.empty() || model.batch <= 0)
    throw Error(POOCH_ERR_INVALID_ARG, "the model has no loss or no batch dimension to train");
  const int64_t batch = model.batch;
  const TensorId loss_id = model.losses[0];

  const int64_t rows = data.rows();
  const int64_t batches = (rows + batch - 1) / batch;
  const auto total =
      static_cast<uint64_t>(cfg.max_steps > 0 ? cfg.max_steps : int64_t{cfg.epochs} * batches);
  const auto step_cap_reached = [&] {
    return cfg.max_steps > 0 && s.optimizer_step() >= static_cast<uint64_t>(cfg.max_steps);
  };
  for (; st.epoch < cfg.epochs && !st.finished; ++st.epoch, st.position = 0, st.loss_sum = 0) {
    // A run resumed from the checkpoint its last step wrote has nothing left.
    if (step_cap_reached()) {
      st.finished = true;
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int64_t> order = epoch_order(rows, cfg.data_seed, st.epoch, cfg.shuffle);
    bool capped = false;
    for (; st.position < batches && !capped; ++st.position) {
      const int64_t first = st.position * batch;
      data.load(order, first, std::min(batch, rows - first));
      s.set_lr_scale(lr_scale_at(cfg, st, s.optimizer_step(), total));
      float loss;
      try {
        s.run(ProgramKind::train_step);
        std::memcpy(&loss, s.staged(loss_id), 4);
      } catch (const Error& e) {
        if (e.code() == POOCH_ERR_CANCELLED) checkpoint(s, cfg, st, s.optimizer());
        throw;
      }
      st.loss_sum += loss;
      if (cb.after_update) cb.after_update(s.optimizer_step());
      if (cb.on_step && !cb.on_step(s.optimizer_step(), loss, st.epoch, st.position, batches)) {
        ++st.position;
        checkpoint(s, cfg, st, s.optimizer());
        throw Error(
            POOCH_ERR_CANCELLED,
            fmt::format("stopped at epoch {}, batch {} of {}{}", st.epoch + 1, st.position, batches,
                        cfg.checkpoint_path.empty()
                            ? ""
                            : "; checkpoint written to " + cfg.checkpoint_path));
      }
      capped = step_cap_reached();
    }
    // The last epoch of a run capped by max_steps may end early: its loss is
    // the mean over the batches it ran.
    EpochReport rep;
    rep.epoch = st.epoch + 1;
    rep.train_loss = st.position ? st.loss_sum / static_cast<double>(st.position) : 0;
    rep.lr = s.optimizer().lr * lr_scale_at(cfg, st, s.optimizer_step(), total);
    double score = -rep.train_loss;
    if (eval) {
      rep.eval = eval();
      rep.evaluated = true;
      score = rep.eval.score;
    }
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (score > st.best) {
      st.best = score;
      st.bad_epochs = st.plateau_bad = 0;
      rep.improved = true;
    } else {
      ++st.bad_epochs;
      if (cfg.plateau_patience > 0 && ++st.plateau_bad >= cfg.plateau_patience) {
        st.plateau_scale *= cfg.plateau_factor;
        st.plateau_bad = 0;
        rep.reduced_lr = true;
      }
      if (cfg.early_stop_patience > 0 && st.bad_epochs >= cfg.early_stop_patience) {
        rep.stopping = true;
        st.finished = true;
      }
    }
    if (capped) st.finished = true;
    if (cb.on_epoch) cb.on_epoch(rep);
    TrainerState next = st;
    ++next.epoch;
    next.position = 0;
    next.loss_sum = 0;
    checkpoint(s, cfg, next, s.optimizer());
  }
}

}  // namespace pooch
