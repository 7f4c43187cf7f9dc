// pooch-run plan: what the planner decides for a model's train step under a
// device budget (no training): the decision for every saved activation, the
// predicted step time, arena and host pool, and an SVG of one step.
// pooch-run profile: one measured train step, per op.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "dense.h"
#include "plan_svg.h"
#include "training.h"

namespace cli {

namespace {

std::string fmt_double(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// The model of --model (with --batch) or --spec (an xmc one with its input width and labels).
int model_from_flags(const std::string& path, const ModelFlags& mf, const TrainFlags& tf,
                     ModelHandle& model, Output& out) {
  if (path.empty() == mf.spec.empty())
    return out.fail(kUsage, "give the model with --model M.pooch or --spec S.json (one of them)");
  if (!path.empty()) {
    if (pooch_status st = pooch_model_load(path.c_str(), &model.p))
      return out.fail(st, "--model " + path);
    if (tf.batch > 0)
      if (pooch_status st = pooch_model_set_run_shape(model.p, tf.batch, 0, 0))
        return out.fail(st, "--batch");
    return kOk;
  }
  // gpt, mlp, resnet and vgg specs are complete as they are; an xmc spec is
  // filled in as train fills it (there is no data here: it must give its
  // input width and labels).
  std::string text;
  if (read_spec_file(mf.spec, &text)) {
    const std::string family = spec_family(text);
    if (!family.empty() && family != "xmc")
      return make_complete_model(text, mf.spec, tf, model, out);
  }
  return make_model(mf, tf, nullptr, nullptr, model, out, "the spec");
}

struct PlanOpts {
  std::string model;
  ModelFlags mf;
  TrainFlags tf;
  DeviceFlags device;
  std::string svg;
  Output output{"plan"};
};

int run_plan(PlanOpts& o) {
  Output& out = o.output;
  if (int rc = check_output_paths({{"--svg", o.svg}}, out)) return rc;
  ModelHandle model;
  if (int rc = model_from_flags(o.model, o.mf, o.tf, model, out)) return rc;
  SessionHandle s;
  const std::string what = o.model.empty() ? o.mf.spec : o.model;
  o.device.plan_only = true;  // nothing is trained: take no memory
  // Plan the step train would run on a spec or model: its optimizer (AdamW
  // for gpt models, else Adam, unless --optimizer says otherwise; an SGD
  // step keeps one state tensor per weight where Adam keeps two), and for
  // gpt models clipping, which keeps every gradient until the updates.
  const pooch_session_params sp = train_step_params(o.tf, pooch_model_family(model.p));
  out.result()["optimizer"] = o.tf.optimizer;
  if (int rc = open_session(model.p, o.device, s, out, &sp)) {
    // For a described card, "it does not fit" is the answer, not a failure
    // of the command's own: say so on stdout too (the exit code stays).
    if (!o.device.machine.empty() && rc == kOutOfBudget) {
      std::printf("plan of a train step of %s for %s: does not fit\n", what.c_str(),
                  o.device.machine.c_str());
      out.result()["fits"] = false;
    }
    return rc;
  }
  char* text = nullptr;
  if (pooch_status st = pooch_session_plan_json(s.p, &text)) return out.fail(st, "plan");
  Json plan = Json::parse(text ? text : "", nullptr, false);
  pooch_string_free(&text);
  if (!plan.is_object()) return out.fail(kInternal, "plan: the library's plan is not JSON");

  const double budget = plan.value("budget", 0.0), arena = plan.value("arena", 0.0);
  const double in_core = plan.value("in_core_arena", 0.0);
  const double t = plan.value("predicted_seconds", 0.0);
  const double t0 = plan.value("predicted_in_core_seconds", 0.0);
  std::printf("plan of a train step of %s (%s, %s, %s backend, %s profile)\n", what.c_str(),
              pooch_model_family(model.p), o.tf.optimizer.c_str(),
              plan.value("backend", std::string("?")).c_str(),
              plan.value("profile", std::string("?")).c_str());
  if (plan.contains("machine")) {
    const Json& m = plan["machine"];
    std::printf(
        "  machine         %s (%s): %s, %s usable; %s GFLOP/s, %s GB/s memory, link "
        "%s/%s GB/s, %s us a copy (achievable figures)\n",
        m.value("name", std::string("?")).c_str(), m.value("file", std::string("?")).c_str(),
        format_bytes(m.value("memory", 0.0)).c_str(),
        format_bytes(m.value("usable_memory", 0.0)).c_str(),
        fmt_double("%.0f", m.value("flops", 0.0) * 1e-9).c_str(),
        fmt_double("%.0f", m.value("memory_bandwidth", 0.0) * 1e-9).c_str(),
        fmt_double("%.1f", m.value("h2d_bandwidth", 0.0) * 1e-9).c_str(),
        fmt_double("%.1f", m.value("d2h_bandwidth", 0.0) * 1e-9).c_str(),
        fmt_double("%.0f", m.value("link_latency", 0.0) * 1e6).c_str());
    std::printf("  fits            yes: device %s, host %s\n",
                format_bytes(plan.value("arena", 0.0)).c_str(),
                format_bytes(plan.value("host_bytes", 0.0)).c_str());
    out.result()["fits"] = true;
  }
  std::printf("  budget          %s\n", budget > 0 ? format_bytes(budget).c_str() : "none");
  std::printf("  in core         arena %s, predicted step %s s\n", format_bytes(in_core).c_str(),
              fmt_double("%.4g", t0).c_str());
  if (plan.value("out_of_core", false)) {
    // auto keeps the best of the strategies it starts from: name that one
    // beside it, so that the line does not read as if the flag were ignored.
    const std::string chosen = plan.value("strategy", std::string("?"));
    const std::string strategy =
        o.device.strategy == "auto" && chosen != "auto" ? "auto, " + chosen + "'s plan" : chosen;
    std::printf(
        "  out of core     strategy %s (%d plans tried in its search; planning took %s s)\n",
        strategy.c_str(), plan.value("plans_tried", 0),
        fmt_double("%.3g", plan.value("planning_seconds", 0.0)).c_str());
  } else {
    std::printf("  fits in core    nothing swapped or recomputed\n");
  }
  std::printf(
      "  arena           %s%s (weights and optimizer state %s)\n", format_bytes(arena).c_str(),
      budget > 0 ? (", " + fmt_double("%.0f", 100 * arena / budget) + "% of the budget").c_str()
                 : "",
      format_bytes(plan.value("persistent_bytes", 0.0)).c_str());
  std::printf("  host pool       %s (the plan needs %s)\n",
              format_bytes(plan.value("host_pool", 0.0)).c_str(),
              format_bytes(plan.value("host_bytes", 0.0)).c_str());
  // The device waits for host launches as it waits for copies: where there
  // are any, the wait is named for both and their time given.
  const double host_s = plan.value("host_launch_seconds", 0.0);
  std::printf(
      "  predicted step  %s s (%s× in core; compute %s s, waiting on copies%s %s s%s)\n",
      fmt_double("%.4g", t).c_str(), fmt_double("%.2f", t0 > 0 ? t / t0 : 1).c_str(),
      fmt_double("%.4g", plan.value("compute_seconds", 0.0)).c_str(),
      host_s > 0 ? " and host launches" : "",
      fmt_double("%.3g", std::max(0.0, t - plan.value("compute_seconds", 0.0))).c_str(),
      host_s > 0 ? ("; the host launches take " + fmt_double("%.3g", host_s) + " s").c_str() : "");

  if (plan.value("paged_bytes", 0.0) > 0)
    std::printf(
        "  paged           %zu weights and optimizer states, %s at home in the host pool "
        "(a step copies %s)\n",
        plan.value("paged", Json::array()).size(),
        format_bytes(plan.value("paged_bytes", 0.0)).c_str(),
        format_bytes(plan.value("paged_copy_bytes", 0.0)).c_str());
  if (plan.value("host_updates", 0) > 0)
    std::printf(
        "  host updates    %d optimizer updates run on the host, where their weights and state "
        "live, and %d other ops (a sparse input layer's forward and row gradient); a step "
        "copies %s out for them\n",
        plan.value("host_updates", 0),
        plan.value("host_launches", 0) - plan.value("host_updates", 0),
        format_bytes(plan.value("host_update_copy_bytes", 0.0)).c_str());

  // Decisions: the saved activations, then the gradients that wait for their
  // updates (with clipping), each a count and bytes per decision.
  const Json acts = plan.value("activations", Json::array());
  for (const bool gradients : {false, true}) {
    std::map<std::string, std::pair<int, double>> by;
    for (const char* d : {"keep", "swap", "recompute"}) by[d] = {0, 0};
    size_t n = 0;
    for (const Json& a : acts) {
      if (a.value("gradient", false) != gradients) continue;
      ++n;
      auto& b = by[a.value("decision", std::string("?"))];
      ++b.first;
      b.second += a.value("bytes", 0.0);
    }
    if (!gradients)
      std::printf("  saved activations %zu: keep %d (%s), swap %d (%s), recompute %d (%s)\n", n,
                  by["keep"].first, format_bytes(by["keep"].second).c_str(), by["swap"].first,
                  format_bytes(by["swap"].second).c_str(), by["recompute"].first,
                  format_bytes(by["recompute"].second).c_str());
    else if (n)
      std::printf("  waiting gradients %zu: keep %d (%s), swap %d (%s)\n", n, by["keep"].first,
                  format_bytes(by["keep"].second).c_str(), by["swap"].first,
                  format_bytes(by["swap"].second).c_str());
  }
  if (!acts.empty()) {
    std::printf("\n");
    std::vector<std::vector<std::string>> rows{{"activation or gradient", "bytes", "decision",
                                                "made at", "last use before the gap",
                                                "first use after"}};
    for (const Json& a : acts)
      rows.push_back({a.value("name", std::string("?")), format_bytes(a.value("bytes", 0.0)),
                      a.value("decision", std::string("?")), std::to_string(a.value("producer", 0)),
                      std::to_string(a.value("last_forward", 0)),
                      std::to_string(a.value("first_backward", 0))});
    print_table(rows, {false, true, false, true, true, true});
  }

  if (!o.svg.empty()) {
    std::string err;
    if (!write_file_atomic(o.svg, plan_svg(plan, "pooch plan: a train step of " + what), &err))
      return out.fail(kBadInput, "--svg: " + err);
    std::printf("\nwrote %s\n", o.svg.c_str());
    out.result()["svg"] = o.svg;
  }
  out.result()["plan"] = std::move(plan);
  return kOk;
}

// The per-op table of a profile JSON (pooch_session_profile_json), after
// `runs` profiled steps: each op's time is its median over them.
int print_profile(pooch_session* s, int runs, Output& out) {
  char* text = nullptr;
  for (int r = 0; r < runs; ++r) {
    pooch_string_free(&text);
    if (pooch_status st = pooch_session_profile_json(s, &text))
      return out.fail(
          st, "profile (run " + std::to_string(r + 1) + " of " + std::to_string(runs) + ")");
  }
  Json prof = Json::parse(text ? text : "", nullptr, false);
  pooch_string_free(&text);
  if (!prof.is_object()) return out.fail(kInternal, "profile: the library's profile is not JSON");
  struct Row {
    int calls = 0;
    double seconds = 0, flops = 0, bytes = 0;
  };
  std::map<std::string, Row> by_op;
  double total = 0;
  for (const Json& op : prof.value("ops", Json::array())) {
    Row& r = by_op[op.value("op", std::string("?"))];
    ++r.calls;
    r.seconds += op.value("seconds", 0.0);
    r.flops += op.value("flops", 0.0);
    r.bytes += op.value("bytes", 0.0);
    total += op.value("seconds", 0.0);
  }
  std::vector<std::pair<std::string, Row>> rows_sorted(by_op.begin(), by_op.end());
  std::stable_sort(rows_sorted.begin(), rows_sorted.end(), [](const auto& a, const auto& b) {
    return a.second.seconds > b.second.seconds;
  });
  std::printf("a measured train step (each op's median of %d runs): %s ms in %zu launches\n\n",
              runs, fmt_double("%.3f", total * 1e3).c_str(),
              prof.value("ops", Json::array()).size());
  std::vector<std::vector<std::string>> rows{{"op", "calls", "ms", "GFLOP/s", "GB/s", "share"}};
  for (const auto& [op, r] : rows_sorted)
    rows.push_back(
        {op, std::to_string(r.calls), fmt_double("%.3f", r.seconds * 1e3),
         r.seconds > 0 && r.flops > 0 ? fmt_double("%.2f", r.flops / r.seconds * 1e-9) : "-",
         r.seconds > 0 ? fmt_double("%.2f", r.bytes / r.seconds * 1e-9) : "-",
         total > 0 ? fmt_double("%.1f%%", 100 * r.seconds / total) : "-"});
  print_table(rows, {false, true, true, true, true, true});
  out.result()["profile"] = std::move(prof);
  return kOk;
}

struct ProfileOpts {
  std::string model;
  ModelFlags mf;
  TrainFlags tf;
  DataFlags data;
  std::string targets;
  int runs = 3;
  DeviceFlags device;
  Output output{"profile"};
};

int run_profile(ProfileOpts& o) {
  Output& out = o.output;
  if (o.model.empty() == o.mf.spec.empty())
    return out.fail(kUsage, "give the model with --model M.pooch or --spec S.json (one of them)");
  if (!o.targets.empty() || is_npy_path(o.data.dir))
    return run_dense_profile(o.model, o.mf, o.tf, o.data.dir, o.targets, o.device, out,
                             [&](pooch_session* s) { return print_profile(s, o.runs, out); });
  Data data;
  if (int rc = load_data(o.data, DataUse::train, data, out)) return rc;
  ModelHandle model;
  if (!o.model.empty()) {
    if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
      return out.fail(st, "--model " + o.model);
    if (is_dense_model(model.p))
      return out.fail(
          kBadInput,
          "--model " + o.model + " is a dense model: profile it on --data X.npy --targets Y.npy");
    if (int rc = check_data_fits(model.p, data.train.p, data.train_source, true, out)) return rc;
    if (o.tf.batch > 0)
      if (pooch_status st = pooch_model_set_run_shape(model.p, o.tf.batch, 0, 0))
        return out.fail(st, "--batch");
    if (int rc = fit_max_nnz(model.p, {data.train.p}, out)) return rc;
  } else if (int rc =
                 make_model(o.mf, o.tf, data.train.p, data.test.p, model, out, data.train_source)) {
    return rc;
  }
  const Json spec = Json::parse(pooch_model_spec_json(model.p), nullptr, false);
  const int64_t batch = spec.is_object() ? spec.value("batch", int64_t{64}) : 64;
  const int64_t labels = pooch_dataset_max_batch_labels(data.train.p, batch);
  int64_t have = spec.is_object() ? spec.value("max_labels", int64_t{0}) : 0;
  if (have == 0) have = batch * 32;  // the library's default
  if (labels > have)
    if (pooch_status st = pooch_model_set_max_labels(model.p, labels))
      return out.fail(st, "max labels");
  SessionHandle s;
  const pooch_session_params sp = train_step_params(o.tf, pooch_model_family(model.p));
  out.result()["optimizer"] = o.tf.optimizer;
  if (int rc = open_session(model.p, o.device, s, out, &sp)) return rc;
  pooch_batch b{};
  if (pooch_status st = pooch_dataset_batch(data.train.p, 0, batch, &b))
    return out.fail(st, "batch");
  float loss = 0;
  if (pooch_status st = pooch_session_step(s.p, &b, &loss)) return out.fail(st, "warm-up step");
  return print_profile(s.p, o.runs, out);
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOpts>();
  CLI::App* c = app.add_subcommand(
      "plan", "Show how a model's train step fits a device budget (no training)");
  c->add_option("--model", o->model, "Model or checkpoint")->type_name("M.pooch");
  c->add_option("--spec", o->mf.spec, "Model spec (an xmc spec with its input width and labels)")
      ->type_name("S.json");
  c->add_option("--batch", o->tf.batch, "Rows per step (default: the model's)")
      ->check(batch_range());
  c->add_option("--clip-norm", o->tf.clip_norm,
                "Plan a step that clips the gradients to this global norm (0: none; default as "
                "train: 1 for gpt models, else none)")
      ->check(in_range(0, 1e6, false))
      ->default_str("auto");
  add_step_optimizer_flag(c, o->tf);
  c->add_option("--svg", o->svg, "Draw memory and the streams over one step")
      ->type_name("FILE.svg");
  add_device_flags(c, o->device, "cpu");
  add_machine_flag(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_plan(*o)); }};
}

Command add_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOpts>();
  CLI::App* c = app.add_subcommand(
      "profile",
      "Time a train step per op on a data set, each op's median over --runs steps (it trains "
      "1 + runs steps; nothing is saved)");
  c->add_option("--model", o->model, "Model or checkpoint")->type_name("M.pooch");
  c->add_option("--spec", o->mf.spec, "Model spec (input width and labels default to the data's)")
      ->type_name("S.json");
  add_data_flags(c, o->data, DataUse::train);
  c->add_option("--targets", o->targets,
                "Dense models: the targets of --data X.npy (floats or integer class ids)")
      ->type_name("Y.npy")
      ->group("Dense data");
  c->add_option("--batch", o->tf.batch, "Rows per step (default: the model's)")
      ->check(batch_range());
  c->add_option("--runs", o->runs, "Profiled steps; each op's time is its median over them")
      ->check(in_range(1, 5, true));
  add_step_optimizer_flag(c, o->tf);
  add_device_flags(c, o->device);
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_profile(*o)); }};
}

}  // namespace cli
