#include "ensemble.h"

#include <cstdio>
#include <vector>

#include "progress.h"

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

}  // namespace

int run_ensemble_training(const ModelFlags& mf, const TrainFlags& f, const Data& data,
                          const DeviceFlags& dev, int members, Output& out) {
  Json& res = out.result();
  Shape1 sh;
  Json spec;
  const auto n = static_cast<size_t>(members);
  // The merged weights, accumulated member by member (the members' sessions
  // are freed as soon as their weights are read: one member in memory at a time).
  std::vector<float> w1, b1, head_w, head_b, skip_w, skip_b, v;
  Json member_results = Json::array();
  double seconds = 0;
  for (size_t i = 0; i < n; ++i) {
    TrainFlags tf = f;
    tf.seed = f.seed + i;
    tf.eval_each_epoch = false;  // a member's figures matter once, before the merge
    std::printf("ensemble member %zu of %zu (seed %llu)\n", i + 1, n,
                static_cast<unsigned long long>(tf.seed));
    ModelHandle model;
    Output mo{"train"};
    if (int rc = make_model(mf, tf, data.train.p, data.test.p, model, mo, data.train_source))
      return rc;
    Shape1 s;
    Json member_spec;
    if (int rc = member_shape(model.p, s, member_spec, out)) return rc;
    if (i == 0) {
      sh = s;
      spec = member_spec;
      const auto H = static_cast<size_t>(sh.hidden), N = n, F = static_cast<size_t>(sh.width),
                 L = static_cast<size_t>(sh.labels);
      w1.assign(F * H * N, 0.f);
      b1.assign(H * N, 0.f);
      head_w.assign(L * H * N, 0.f);
      head_b.assign(L, 0.f);
      if (sh.skip) {
        skip_w.assign(F * L, 0.f);
        skip_b.assign(L, 0.f);
      }
    }
    const auto H = static_cast<size_t>(sh.hidden), F = static_cast<size_t>(sh.width),
               L = static_cast<size_t>(sh.labels);
    const float inv_n = 1.0f / static_cast<float>(n);
    auto merge = [&](pooch_session* ss) -> int {
      // fc0.weight [F, H] -> columns [i H, (i + 1) H) of [F, N H].
      if (int rc = read_f32(ss, "fc0.weight", v, out)) return rc;
      for (size_t r = 0; r < F; ++r)
        std::copy(v.begin() + static_cast<long>(r * H), v.begin() + static_cast<long>((r + 1) * H),
                  w1.begin() + static_cast<long>(r * H * n + i * H));
      if (int rc = read_f32(ss, "fc0.bias", v, out)) return rc;
      std::copy(v.begin(), v.end(), b1.begin() + static_cast<long>(i * H));
      // head.weight [L, H] -> columns [i H, (i + 1) H) of [L, N H], over N.
      if (int rc = read_f32(ss, "head.weight", v, out)) return rc;
      for (size_t l = 0; l < L; ++l)
        for (size_t h = 0; h < H; ++h) head_w[l * H * n + i * H + h] = v[l * H + h] * inv_n;
      if (int rc = read_f32(ss, "head.bias", v, out)) return rc;
      for (size_t l = 0; l < L; ++l) head_b[l] += v[l] * inv_n;
      if (sh.skip) {
        if (int rc = read_f32(ss, "head.skip.weight", v, out)) return rc;
        for (size_t j = 0; j < v.size(); ++j) skip_w[j] += v[j] * inv_n;
        if (int rc = read_f32(ss, "head.skip.bias", v, out)) return rc;
        for (size_t j = 0; j < v.size(); ++j) skip_b[j] += v[j] * inv_n;
      }
      return kOk;
    };
    mo.json = out.json;
    const int rc = run_training(model.p, false, data, tf, dev, false, mo, merge);
    Json& mr = mo.result();
    mr.erase("command");
    mr["seed"] = tf.seed;
    if (mr.contains("seconds")) seconds += mr["seconds"].get<double>();
    member_results.push_back(mr);
    res["members"] = member_results;
    if (rc != kOk) {
      if (rc == kInterrupted)
        std::printf(
            "ensemble interrupted in member %zu of %zu: an ensemble is not resumed; "
            "run the command again\n",
            i + 1, n);
      return out.fail(rc, "--ensemble: member " + std::to_string(i + 1) + " of " +
                              std::to_string(n) + " stopped");
    }
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
