// A tiny ResNet-18 against PyTorch: tests/golden/make_cnn_golden.py wrote
// tests/golden/resnet_tiny.json with Debian's python3-torch; this test builds
// the same network with pooch's resnet builder (runtime/models/cnn.cpp),
// loads PyTorch's weights by their torchvision names and checks the logits,
// the loss, every parameter's gradient, and the losses, parameters and
// running statistics after 10 steps of SGD with momentum.
//
// Tolerance: 1e-4 relative, norm-wise per tensor, against PyTorch's float64
// run of the same float32 weights and batch (convolution algorithms sum in
// different orders; float32 PyTorch itself is 4e-5 from the exact answer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/autodiff.h"
#include "runtime/core/optimizer.h"
#include "runtime/models/build.h"
#include "runtime/models/model_spec.h"
#include "runtime/session/session.h"

namespace pooch {
namespace {

using nlohmann::json;

constexpr double kRelTol = 1e-4;

const json& golden() {
  static const json j = [] {
    std::ifstream f(POOCH_CNN_GOLDEN_JSON);
    if (!f) throw std::runtime_error("cannot open " POOCH_CNN_GOLDEN_JSON);
    return json::parse(f);
  }();
  return j;
}

std::vector<float> floats(const json& a) {
  std::vector<float> out;
  for (const json& x : a) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

std::map<std::string, double>& worst_errors() {
  static std::map<std::string, double> m;
  return m;
}

// Norm-wise: ||got − want|| / ||want|| over the tensor (a scalar's relative
// error), which is what rounding bounds; an element that cancels to near 0
// carries the rounding of the tensor's scale, not of its own size.
void expect_close(const std::string& what, const float* got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  size_t at = 0;
  double worst = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    if (!(std::fabs(d) <= worst)) worst = std::fabs(d), at = i;
  }
  const double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  worst_errors()[what] = rel;
  EXPECT_LE(rel, kRelTol) << what << ": relative error " << rel << "; the worst element " << at
                          << " is " << got[at] << ", torch has " << want[at];
}

class CnnGolden : public testing::TestWithParam<int> {};

TEST_P(CnnGolden, ResNet18MatchesPyTorch) {
  const json& j = golden();
  const ModelSpec spec = spec_from_json(j["spec"].dump(), "resnet_tiny.json spec");
  auto model = std::shared_ptr<Model>(build_model(spec));
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = GetParam();
  cfg.optimizer.kind = OptimizerConfig::Kind::sgd;
  cfg.optimizer.lr = j["sgd"]["lr"];
  cfg.optimizer.momentum = j["sgd"]["momentum"];
  Session s(model, cfg);
  const Graph& g = s.graph();

  // Every parameter and buffer by name: pooch's model has exactly torch's.
  size_t weights = 0;
  for (const TensorDesc& d : g.tensors())
    if (d.role == Role::weight) {
      ++weights;
      ASSERT_TRUE(j["init"].contains(d.name)) << "torch has no tensor " << d.name;
    }
  ASSERT_EQ(weights, j["init"].size());
  auto write_init = [&] {
    for (const auto& [name, v] : j["init"].items()) {
      const std::vector<float> f = floats(v);
      const TensorId t = *g.find(name);
      ASSERT_EQ(static_cast<int64_t>(f.size()), g.tensor(t).numel()) << name;
      s.write_tensor(name, f.data(), f.size() * 4);
    }
    for (const TensorDesc& d : g.tensors())
      if (d.role == Role::optimizer_state) {
        std::vector<std::byte> zeros(d.bytes());
        s.write_tensor(d.name, zeros.data(), zeros.size());
      }
  };
  write_init();
  const std::vector<float> x = floats(j["x"]);
  std::vector<int32_t> cls;
  for (const json& c : j["classes"]) cls.push_back(c.get<int32_t>());
  s.set_input("batch.x", x.data(), x.size() * 4);
  s.set_input("batch.class", cls.data(), cls.size() * 4);

  // ---- one training-mode forward and backward pass, no update ----
  // On a copy of the forward graph with its backward pass and every gradient
  // marked as an output (a session stages only a graph's outputs).
  {
    Graph fg = model->graph;
    const TensorId logits = *fg.find("fc.out"), loss = *fg.find("loss");
    const std::vector<WeightGrad> wg = build_backward(fg, loss);
    std::map<std::string, TensorId> grad_of;
    for (const WeightGrad& w : wg) grad_of[fg.tensor(w.weight).name] = w.grad;
    std::vector<TensorId> wanted = {logits, loss};
    for (const auto& [name, v] : j["grad"].items()) {
      ASSERT_TRUE(grad_of.count(name)) << "no gradient for " << name;
      wanted.push_back(grad_of[name]);
    }
    for (TensorId t : wanted) fg.mark_output(t);
    SessionConfig gc = cfg;
    gc.train = false;  // the graph carries its own backward pass
    Session gs(std::make_shared<Model>(model_from_graph(fg)), gc);
    for (const auto& [name, v] : j["init"].items()) {
      const std::vector<float> f = floats(v);
      gs.write_tensor(name, f.data(), f.size() * 4);
    }
    gs.set_input("batch.x", x.data(), x.size() * 4);
    gs.set_input("batch.class", cls.data(), cls.size() * 4);
    const int prog = gs.compile(wanted, true, false);  // training mode: batch statistics
    gs.run_compiled(prog);
    auto out = [&](TensorId t) { return static_cast<const float*>(gs.staged(t)); };
    expect_close("logits", out(logits), floats(j["forward"]["logits"]));
    expect_close("loss", out(loss), {static_cast<float>(j["forward"]["loss"].get<double>())});
    for (const auto& [name, v] : j["grad"].items())
      expect_close("grad " + name, out(grad_of[name]), floats(v));
  }

  // ---- 10 SGD steps from the initial state ----
  std::vector<float> losses;
  const int steps = j["sgd"]["steps"];
  for (int i = 0; i < steps; ++i) {
    s.run(ProgramKind::train_step);
    float l = 0;
    s.get_output("loss", &l, sizeof l);
    losses.push_back(l);
  }
  expect_close("sgd losses", losses.data(), floats(j["sgd"]["losses"]));
  for (const auto& [name, v] : j["sgd"]["final"].items()) {
    const std::vector<std::byte> b = s.read_tensor(name);
    std::vector<float> f(b.size() / 4);
    std::memcpy(f.data(), b.data(), b.size());
    expect_close("final " + name, f.data(), floats(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CnnGolden, testing::Values(1, 2));

class Report : public testing::Environment {
 public:
  // The largest error of each group: forward values, gradients, the SGD run.
  void TearDown() override {
    for (const char* group : {"logits", "loss", "grad ", "sgd losses", "final "}) {
      double worst = 0;
      std::string what;
      for (const auto& [k, v] : worst_errors())
        if (k.rfind(group, 0) == 0 && v >= worst) worst = v, what = k;
      if (!what.empty()) std::printf("largest relative error: %.3g (%s)\n", worst, what.c_str());
    }
  }
};
const auto* const kReport = testing::AddGlobalTestEnvironment(new Report);

}  // namespace
}  // namespace pooch
