#include "lm_training.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "npy.h"
#include "progress.h"
#include "sigint.h"

namespace cli {

namespace {

// The token ids of `path`: a .npy array of integers (any shape, read in C
// order), a text file's bytes (--bytes) or an llm.c token file. The library
// checks them against the vocabulary. Exit code.
int load_tokens(const std::string& path, bool bytes, std::vector<int32_t>& ids, Output& out) {
  if (path.ends_with(".npy") && !bytes) {
    NpyArray a;
    std::string err;
    if (!read_npy(path, &a, &err)) return out.fail(kBadInput, "--data " + err);
    if (a.is_float())
      return out.fail(kBadInput, "--data " + path + ": holds " + npy_type_name(a.type) +
                                     " values; token ids are integers (int32 or int64)");
    const std::vector<int64_t> v = npy_as_i64(a);
    ids.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || v[i] > INT32_MAX)
        return out.fail(kBadInput, "--data " + path + ": element " + std::to_string(i) + " is " +
                                       std::to_string(v[i]) + ", not a token id (0 to 2147483647)");
      ids[i] = static_cast<int32_t>(v[i]);
    }
    return kOk;
  }
  TokensHandle t;
  int64_t n = 0;
  if (pooch_status st = pooch_tokens_load(path.c_str(), bytes ? 1 : 0, &t.p, &n)) {
    const int rc = out.fail(
        st, "--data " + path + (bytes ? "" : " (a text file trains byte by byte with --bytes)"));
    return rc;
  }
  ids.assign(t.p, t.p + n);
  return kOk;
}

Json spec_of(const pooch_model* m) {
  const Json j = Json::parse(pooch_model_spec_json(m), nullptr, false);
  return j.is_object() ? j : Json::object();
}

// A training run's state, and the validation results of a language model.
struct LmRun : RunState {
  Json evals = Json::array();
};

void on_eval(void* user, int64_t step, double loss, double perplexity) {
  auto* r = static_cast<LmRun*>(static_cast<RunState*>(user));
  r->progress->clear();
  std::printf("step %lld  validation loss %.5f  perplexity %.3f\n", static_cast<long long>(step),
              loss, perplexity);
  std::fflush(stdout);
  Json j;
  j["step"] = step;
  j["val_loss"] = loss;
  j["perplexity"] = perplexity;
  r->evals.push_back(j);
  Json l = {{"type", "eval"}};
  for (auto& [k, v] : j.items()) l[k] = v;
  log_line(r->log, l);
}

void on_lm_epoch(void* user, const pooch_epoch_report* rep) {
  auto* r = static_cast<LmRun*>(static_cast<RunState*>(user));
  r->progress->clear();
  std::printf("epoch %d  train loss %.5f  %.1f s  lr %.3g%s\n", rep->epoch, rep->train_loss,
              rep->seconds, rep->learning_rate, rep->stopping ? "  (early stop)" : "");
  std::fflush(stdout);
  const Json j = epoch_json(*rep);  // no "eval": a language model's are in on_eval
  r->epochs.push_back(j);
  Json l = {{"type", "epoch"}};
  for (auto& [k, v] : j.items()) l[k] = v;
  log_line(r->log, l);
}

bool given(const CLI::App* app, const char* flag) {
  return app && app->count(flag) > 0;
}

}  // namespace

void add_lm_flags(CLI::App* app, LmFlags& f) {
  const char* g = "Language models (gpt)";
  app->add_flag("--bytes", f.bytes,
                "gpt: --data is a text file whose bytes are the tokens (a vocabulary of 256)")
      ->group(g);
  app->add_option("--context", f.context,
                  "gpt: tokens per training row (1 to the model's context length; default: the "
                  "model's)")
      ->check(non_negative())
      ->group(g);
  app->add_option("--steps", f.steps,
                  "gpt: optimizer steps in all, over resumes (default: --epochs decide)")
      ->check(non_negative())
      ->group(g);
  app->add_option("--eval-every", f.eval_every,
                  "gpt: validation loss and perplexity every N steps too (0: after each epoch)")
      ->check(non_negative())
      ->group(g);
}

bool spec_is_gpt(const std::string& spec_text) {
  return spec_family(spec_text) == "gpt";
}

int make_gpt_model(const std::string& spec_text, const std::string& spec_path, const TrainFlags& tf,
                   const LmFlags& lf, ModelHandle& model, Output& out) {
  return make_complete_model(spec_text, spec_path, tf, model, out, [&](Json& j) {
    if (lf.bytes && !j.contains("vocab_size")) j["vocab_size"] = 256;
  });
}

int run_lm_training(pooch_model* model, bool resume, const std::string& data, const LmFlags& lf,
                    const TrainFlags& f, const DeviceFlags& dev, const CLI::App* app, Output& out) {
  Json& res = out.result();
  if (data.empty())
    return out.fail(kUsage,
                    "a gpt model trains on --data TOKENS (an llm.c token file, a .npy "
                    "array of ids, or a text file with --bytes)");
  if (int rc = check_output_paths(
          {{"--out", f.out}, {"--checkpoint", f.checkpoint}, {"--log", f.log}}, out))
    return rc;
  if (!resume) {
    // The run shape a finetune changes; a resumed run keeps its checkpoint's.
    if (f.batch > 0)
      if (pooch_status st = pooch_model_set_run_shape(model, f.batch, 0, 0))
        return out.fail(st, "--batch");
    if (lf.context > 0) {
      const int64_t n_ctx = spec_of(model).value("n_ctx", int64_t{0});
      if (lf.context > n_ctx)
        return out.fail(kBadInput, "--context " + std::to_string(lf.context) +
                                       " is longer than the model's context length (n_ctx " +
                                       std::to_string(n_ctx) + "); use 1 to " +
                                       std::to_string(n_ctx));
      if (pooch_status st = pooch_model_set_sequence_length(model, lf.context))
        return out.fail(st, "--context");
    }
  } else if (lf.context > 0 || f.batch > 0) {
    std::printf("resuming: --context and --batch are the checkpoint's\n");
  }
  std::vector<int32_t> tokens;
  if (int rc = load_tokens(data, lf.bytes, tokens, out)) return rc;
  const Json spec = spec_of(model);
  const int64_t batch = spec.value("batch", int64_t{1});
  int64_t context = spec.value("seq", int64_t{0});
  if (context == 0) context = spec.value("n_ctx", int64_t{1});
  const auto n = static_cast<int64_t>(tokens.size());
  std::printf("data: %s: %lld tokens (vocabulary %lld), %lld tokens per row, %lld rows per step\n",
              data.c_str(), static_cast<long long>(n),
              static_cast<long long>(spec.value("vocab_size", int64_t{0})),
              static_cast<long long>(context), static_cast<long long>(batch));
  res["data"] = {{"path", data}, {"tokens", n}, {"bytes", lf.bytes}};

  pooch_session_params sp;
  pooch_session_default_params(&sp);
  std::string err;
  if (!apply_device_flags(dev, &sp, &err)) return out.fail(kUsage, err);
  apply_optimizer_flags(f, f.optimizer, &sp);  // adamw unless --optimizer (resolve_gpt)
  sp.resume = resume ? 1 : 0;

  pooch_lm_params lp;
  pooch_lm_default_params(&lp);
  lp.val_fraction = lf.val_fraction;
  lp.eval_every = lf.eval_every;
  lp.on_eval = on_eval;

  pooch_train_params tp;
  pooch_train_default_params(&tp);
  tp.epochs = f.epochs;
  if (lf.steps > 0) {
    // Epochs enough for the steps (the windows as pooch_train_tokens cuts them).
    const int64_t val =
        lf.val_fraction > 0
            ? std::max<int64_t>(std::llround(lf.val_fraction * static_cast<double>(n)), context + 1)
            : 0;
    const int64_t rows = n - val > context ? (n - val - 1) / context : 0;
    const int64_t per_epoch = (rows + batch - 1) / batch;
    tp.epochs =
        per_epoch > 0
            ? static_cast<int>(std::min<int64_t>((lf.steps + per_epoch - 1) / per_epoch, INT_MAX))
            : 1;
    tp.max_steps = lf.steps;
  }
  tp.warmup_steps = f.warmup_steps;
  tp.lr_schedule = f.lr_schedule == "cosine" ? POOCH_LR_COSINE : POOCH_LR_PLATEAU;
  tp.min_lr_ratio = static_cast<float>(f.lr_min_ratio);
  // Reduce-on-plateau and early stopping fight a schedule: off unless asked for.
  tp.plateau_factor = f.plateau_factor;
  tp.plateau_patience = given(app, "--plateau-patience") ? f.plateau_patience : 0;
  tp.early_stop_patience = given(app, "--early-stop") ? f.early_stop : 0;
  tp.data_seed = f.seed;
  tp.allow_other_data = f.force ? 1 : 0;
  const std::string ckpt = !f.checkpoint.empty() ? f.checkpoint : f.out + ".ckpt";
  tp.checkpoint_path = ckpt.c_str();

  LogFile log_file;
  if (int rc = open_log(f.log, resume, log_file, out)) return rc;

  SessionHandle s;
  if (pooch_status st = pooch_session_create(model, &sp, &s.p)) return out.fail(st, "session");
  print_memory(s.p, out);
  res["model_spec"] = spec;

  Progress progress(isatty(STDOUT_FILENO) != 0, tp.epochs);
  LmRun state;
  state.progress = &progress;
  state.log = log_file.f;
  state.max_steps = f.max_steps;
  tp.on_step = run_on_step;
  tp.on_epoch = on_lm_epoch;
  tp.user = static_cast<RunState*>(&state);  // run_on_step's; the others cast back

  const auto t0 = std::chrono::steady_clock::now();
  pooch_status st;
  {
    SigintGuard guard;
    st = pooch_train_tokens(s.p, tokens.data(), n, &tp, &lp);
  }
  progress.clear();
  const double secs = seconds_since(t0);
  res["epochs"] = state.epochs;
  res["evals"] = state.evals;
  res["steps"] = state.steps;
  res["seconds"] = secs;
  if (!state.evals.empty()) res["final"] = state.evals.back();

  if (st == POOCH_ERR_CANCELLED) {
    const bool by_signal = !state.stopped_by_max;
    res["interrupted"] = true;
    std::printf("%s at step %lld (epoch %d, batch %lld of %lld) after %.1f s\n",
                by_signal ? "interrupted" : "stopped (--max-steps)",
                static_cast<long long>(state.last_step), state.last_epoch,
                static_cast<long long>(state.last_batch), static_cast<long long>(state.batches),
                secs);
    res["checkpoint"] = ckpt;
    res["resume_command"] = resume_command(ckpt);
    std::printf("checkpoint written to %s\nresume with: %s\n", ckpt.c_str(),
                resume_command(ckpt).c_str());
    return by_signal ? kInterrupted : kOk;
  }
  if (st != POOCH_OK) return out.fail(st, "training on " + data);
  res["interrupted"] = false;
  std::printf("trained %lld steps in %.1f s (%.0f tokens/s)\n", static_cast<long long>(state.steps),
              secs, secs > 0 ? static_cast<double>(state.steps * batch * context) / secs : 0.0);
  if (pooch_status st2 = pooch_session_save(s.p, f.out.c_str()))
    return out.fail(st2, "saving " + f.out);
  std::printf("model written to %s (checkpoint: %s)\n", f.out.c_str(), ckpt.c_str());
  res["out"] = f.out;
  res["checkpoint"] = ckpt;
  return kOk;
}

}  // namespace cli
