#include "ensemble.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "console.h"
#include "progress.h"
#include "sigint.h"

namespace cli {

namespace {

// The weights of a member as f32 vectors, read from its trained session.
int read_f32(const pooch_session* s, const char* name, std::vector<float>& v, Output& out) {
  size_t bytes = 0;
  if (pooch_status st = pooch_session_read_tensor(s, name, nullptr, &bytes))
    return out.fail(st, std::string("reading ") + name);
  v.resize(bytes / sizeof(float));
  if (pooch_status st = pooch_session_read_tensor(s, name, v.data(), &bytes))
    return out.fail(st, std::string("reading ") + name);
  return kOk;
}

// What the merge needs to know of the members' shape, from their spec.
struct Shape1 {
  int64_t width = 0, hidden = 0, labels = 0;
  bool skip = false;
};

// Only models of one (sparse input) linear layer, optional dropout and a
// dense output layer merge exactly into one wider model of the same kind.
int member_shape(const pooch_model* m, Shape1& sh, Json& spec, Output& out) {
  spec = Json::parse(pooch_model_spec_json(m), nullptr, false);
  const std::string why =
      "--ensemble: members merge into one model only when they have one hidden (linear) "
      "layer, at most a dropout, a dense output layer and sparse input (so: no --spec, "
      "--bottleneck or --fan-in; ";
  if (!spec.is_object() || !spec.contains("layers") || !spec["layers"].is_array())
    return out.fail(kUsage, why + "the model's spec could not be read)");
  const Json& layers = spec["layers"];
  int linear = 0, dense_head = 0, other = 0;
  for (const Json& l : layers) {
    const std::string t = l.value("type", std::string());
    if (t == "linear")
      ++linear;
    else if (t == "dense")
      ++dense_head;
    else if (t != "dropout")
      ++other;
  }
  if (linear != 1 || dense_head != 1 || other != 0 || layers.empty() ||
      layers[0].value("type", std::string()) != "linear" ||
      spec["input"].value("kind", std::string("sparse")) != "sparse")
    return out.fail(kUsage, why + "this model has " + layers.dump() + ")");
  sh.width = spec["input"].value("width", int64_t{0});
  sh.hidden = layers[0].value("width", int64_t{0});
  sh.labels = spec.value("labels", int64_t{0});
  sh.skip = spec.value("skip", false);
  return kOk;
}

// The backend a session of `model` on `dev` would run on ("cpu" or
// "cuda"), from a session that only plans (it takes no memory).
std::string backend_of(pooch_model* model, const DeviceFlags& dev) {
  DeviceFlags d = dev;
  d.plan_only = true;
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  std::string err;
  SessionHandle s;
  pooch_memory_report m{};
  if (!apply_device_flags(d, &sp, &err) || pooch_session_create(model, &sp, &s.p) != POOCH_OK ||
      pooch_session_memory(s.p, &m) != POOCH_OK || !m.backend)
    return {};  // the member's own session reports what is wrong
  return m.backend;
}

// One member: its flags, model, output and the merge's per-member parts.
struct Member {
  TrainFlags tf;
  DeviceFlags dev;
  ModelHandle model;
  Output out{"train"};
  int rc = kOk;
  std::vector<float> head_b, skip_w, skip_b;  // summed over the members in order, after
};

}  // namespace

int run_ensemble_training(const ModelFlags& mf, const TrainFlags& f, const Data& data,
                          const DeviceFlags& dev, int members, Output& out) {
  Json& res = out.result();
  Shape1 sh;
  Json spec;
  const auto n = static_cast<size_t>(members);
  std::vector<Member> ms(n);
  for (size_t i = 0; i < n; ++i) {
    ms[i].tf = f;
    ms[i].tf.seed = f.seed + i;
    ms[i].tf.eval_each_epoch = false;  // a member's figures matter once, before the merge
    ms[i].tf.member = static_cast<int>(i + 1);
    ms[i].out.json = out.json;
  }
  // Member 0's model first: the merge's shape, and the backend.
  if (int rc = make_model(mf, ms[0].tf, data.train.p, data.test.p, ms[0].model, ms[0].out,
                          data.train_source))
    return rc;
  if (int rc = member_shape(ms[0].model.p, sh, spec, out)) return rc;
  // On the CPU, members train at once, each on its share of --threads: a
  // small model's step is too short for two threads to split well (a
  // Debtags member: 1.5 ms, about 15 kernels, each ending in a barrier), and
  // members share nothing. A member's bits depend on its own thread count
  // only: --threads 2 trains the same two members as --threads 1, in less
  // than half the time (docs/BENCHMARKS.md, "Denormals, and members trained
  // at once"). Elsewhere one at a time.
  const int threads = dev.threads > 0
                          ? dev.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int at_once = backend_of(ms[0].model.p, dev) == "cpu" ? std::min(members, threads) : 1;
  for (size_t i = 0; i < n; ++i) {
    ms[i].dev = dev;
    if (at_once > 1) {
      const int slot = static_cast<int>(i % static_cast<size_t>(at_once));
      ms[i].dev.threads = threads / at_once + (slot < threads % at_once ? 1 : 0);
    }
  }
  LogFile log_file;  // one --log for all members, their lines tagged "member"
  if (int rc = open_log(f.log, false, log_file, out)) return rc;
  for (Member& m : ms) m.tf.log_file = log_file.f;

  const auto H = static_cast<size_t>(sh.hidden), F = static_cast<size_t>(sh.width),
             L = static_cast<size_t>(sh.labels);
  // The merged weights: each member writes its own columns.
  std::vector<float> w1(F * H * n, 0.f), b1(H * n, 0.f), head_w(L * H * n, 0.f), head_b(L, 0.f),
      skip_w, skip_b;
  if (sh.skip) {
    skip_w.assign(F * L, 0.f);
    skip_b.assign(L, 0.f);
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  auto train_member = [&](size_t i) {
    Member& m = ms[i];
    std::vector<float> v;
    auto merge = [&](pooch_session* ss) -> int {
      // fc0.weight [F, H] -> columns [i H, (i + 1) H) of [F, N H].
      if (int rc = read_f32(ss, "fc0.weight", v, m.out)) return rc;
      for (size_t r = 0; r < F; ++r)
        std::copy(v.begin() + static_cast<long>(r * H), v.begin() + static_cast<long>((r + 1) * H),
                  w1.begin() + static_cast<long>(r * H * n + i * H));
      if (int rc = read_f32(ss, "fc0.bias", v, m.out)) return rc;
      std::copy(v.begin(), v.end(), b1.begin() + static_cast<long>(i * H));
      // head.weight [L, H] -> columns [i H, (i + 1) H) of [L, N H], over N.
      if (int rc = read_f32(ss, "head.weight", v, m.out)) return rc;
      for (size_t l = 0; l < L; ++l)
        for (size_t h = 0; h < H; ++h) head_w[l * H * n + i * H + h] = v[l * H + h] * inv_n;
      if (int rc = read_f32(ss, "head.bias", m.head_b, m.out)) return rc;
      if (sh.skip) {
        if (int rc = read_f32(ss, "head.skip.weight", m.skip_w, m.out)) return rc;
        if (int rc = read_f32(ss, "head.skip.bias", m.skip_b, m.out)) return rc;
      }
      return kOk;
    };
    try {
      m.rc = run_training(m.model.p, false, data, m.tf, m.dev, false, m.out, merge);
    } catch (const std::exception& e) {
      m.rc = m.out.fail(
          kInternal, std::string("--ensemble: member ") + std::to_string(i + 1) + ": " + e.what());
    }
    pooch_model_free(&m.model.p);  // its weights are merged: free them before the next wave
  };

  const auto t0 = std::chrono::steady_clock::now();
  {
    SigintGuard guard;  // one for all members: Ctrl-C stops every member's run
    for (size_t first = 0; first < n; first += static_cast<size_t>(at_once)) {
      const size_t last = std::min(n, first + static_cast<size_t>(at_once));
      for (size_t i = first; i < last; ++i) {
        if (!ms[i].model.p)
          if (int rc = make_model(mf, ms[i].tf, data.train.p, data.test.p, ms[i].model, ms[i].out,
                                  data.train_source))
            return rc;
        Shape1 s;
        Json member_spec;
        if (int rc = member_shape(ms[i].model.p, s, member_spec, out)) return rc;
        std::printf("ensemble member %zu of %zu (seed %llu)%s\n", i + 1, n,
                    static_cast<unsigned long long>(ms[i].tf.seed),
                    at_once > 1 ? (", " + std::to_string(ms[i].dev.threads) + " thread" +
                                   (ms[i].dev.threads > 1 ? "s" : "") + ", at once with the others")
                                      .c_str()
                                : "");
      }
      if (last - first == 1) {
        train_member(first);
      } else {
        std::vector<std::thread> running;
        for (size_t i = first; i < last; ++i)
          running.emplace_back([&, i] {
            LinePrefix prefix("member " + std::to_string(i + 1) + ": ");
            train_member(i);
          });
        for (std::thread& t : running) t.join();
      }
      for (size_t i = first; i < last; ++i) {
        Json mr = ms[i].out.result();
        mr.erase("command");
        mr["seed"] = ms[i].tf.seed;
        res["members"].push_back(mr);
      }
      for (size_t i = first; i < last; ++i) {
        const int rc = ms[i].rc;
        if (rc == kOk) continue;
        if (rc == kInterrupted)
          std::printf(
              "ensemble interrupted in member %zu of %zu: an ensemble is not resumed; "
              "run the command again\n",
              i + 1, n);
        return out.fail(rc, "--ensemble: member " + std::to_string(i + 1) + " of " +
                                std::to_string(n) + " stopped");
      }
    }
  }
  const double seconds = seconds_since(t0);
  // The averaged parts, summed in member order (the same bits however many ran at once).
  for (const Member& m : ms) {
    for (size_t l = 0; l < L; ++l) head_b[l] += m.head_b[l] * inv_n;
    for (size_t j = 0; j < m.skip_w.size(); ++j) skip_w[j] += m.skip_w[j] * inv_n;
    for (size_t j = 0; j < m.skip_b.size(); ++j) skip_b[j] += m.skip_b[j] * inv_n;
  }

  // The merged model: the members' spec with N times the hidden width.
  spec["layers"][0]["width"] = sh.hidden * static_cast<int64_t>(n);
  spec["seed"] = f.seed;
  ModelHandle merged;
  const std::string text = spec.dump();
  const std::string source = "the merged ensemble of " + std::to_string(n) + " members";
  if (pooch_status st = pooch_model_create_from_spec(text.c_str(), source.c_str(), &merged.p))
    return out.fail(st, "--ensemble: merging");
  SessionHandle s;
  if (int rc = open_session(merged.p, dev, s, out)) return rc;
  const auto put = [&](const char* name, const std::vector<float>& t) -> int {
    if (pooch_status st = pooch_session_write_tensor(s.p, name, t.data(), t.size() * sizeof(float)))
      return out.fail(st, std::string("--ensemble: writing ") + name);
    return kOk;
  };
  for (auto [name, t] : {std::pair{"fc0.weight", &w1},
                         {"fc0.bias", &b1},
                         {"head.weight", &head_w},
                         {"head.bias", &head_b}})
    if (int rc = put(name, *t)) return rc;
  if (sh.skip) {
    if (int rc = put("head.skip.weight", skip_w)) return rc;
    if (int rc = put("head.skip.bias", skip_b)) return rc;
  }
  res["model_spec"] = Json::parse(pooch_model_spec_json(merged.p), nullptr, false);
  res["ensemble"] = members;
  res["members_at_once"] = at_once;
  res["seconds"] = seconds;
  res.erase("final");
  if (data.test.p) {
    float a = 0, b = 0;
    if (int rc = propensity(f, data.name, &a, &b, out)) return rc;
    pooch_metrics m{};
    if (pooch_status st = pooch_evaluate(s.p, data.test.p, data.train.p, a, b, &m))
      return out.fail(st, "--ensemble: evaluating the merged model");
    std::printf("ensemble of %zu (scores averaged) on %s:\n", n, data.test_source.c_str());
    print_metrics_table(m);
    res["final"] = metrics_json(m);
  }
  res["interrupted"] = false;
  std::printf("trained %zu members in %.1f s\n", n, seconds);
  if (pooch_status st = pooch_session_save(s.p, f.out.c_str()))
    return out.fail(st, "saving " + f.out);
  std::printf("model written to %s (no checkpoint: an ensemble is not resumed)\n", f.out.c_str());
  res["out"] = f.out;
  return kOk;
}

}  // namespace cli
