// A golden test against PyTorch: tests/golden/make_golden.py computes a tiny
// XMC model (sparse_linear -> relu -> ffi_linear -> bce_logits) with
// torch.nn.functional and torch.optim.Adam and writes every value to
// tests/golden/xmc_tiny.json; this test builds the same graph with pooch's
// internals (Graph, build_backward, append_optimizer, Executor on the CPU
// backend) and compares the forward values, every gradient of one step, the
// losses of 10 Adam steps and the weights after them.
//
// The JSON is found through the environment variable POOCH_GOLDEN_JSON if set,
// else through the compile definition of the same name (the build passes the
// file's absolute path in the source tree).
//
// Tolerance, for every float compared: |pooch - torch| <= 1e-5 * max(|torch|, 1e-3).
// (Both sides compute in f32; torch's own f32 run is within 1e-6 of the same
// computation in f64, see make_golden.py's report.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/core/autodiff.h"
#include "runtime/core/graph.h"
#include "runtime/session/session.h"
#include "runtime/core/optimizer.h"

using namespace pooch;
using nlohmann::json;

namespace {

constexpr double kRelTol = 1e-5;
constexpr double kFloor = 1e-3;

std::string golden_path() {
  if (const char* p = std::getenv("POOCH_GOLDEN_JSON"); p && *p) return p;
#ifdef POOCH_GOLDEN_JSON
  return POOCH_GOLDEN_JSON;
#else
  return {};
#endif
}

const json& golden() {
  static const json j = [] {
    const std::string path = golden_path();
    if (path.empty())
      throw std::runtime_error("set POOCH_GOLDEN_JSON to tests/golden/xmc_tiny.json");
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open the golden file " + path);
    return json::parse(f);
  }();
  return j;
}

std::vector<float> floats(const json& a) {
  std::vector<float> out;
  out.reserve(a.size());
  for (const json& x : a) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

std::vector<int32_t> ints(const json& a) {
  std::vector<int32_t> out;
  out.reserve(a.size());
  for (const json& x : a) out.push_back(x.get<int32_t>());
  return out;
}

// The largest relative error seen per quantity, over every test case; printed
// at the end of the run.
std::map<std::string, double>& max_errors() {
  static std::map<std::string, double> m;
  return m;
}

double rel_err(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), kFloor);
}

// Compares n floats; reports the worst element of each quantity.
void expect_close(const std::string& what, const float* got, const std::vector<float>& want) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = rel_err(got[i], want[i]);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
    }
  }
  double& m = max_errors()[what];
  m = std::max(m, worst);
  EXPECT_LE(worst, kRelTol) << what << ": element " << at << " is " << got[at] << ", torch has "
                            << want[at] << " (relative error " << worst << ")";
}

struct Case {
  DType index_dtype;
  int threads;
};

std::string case_str(const Case& c) {
  return std::string(c.index_dtype == DType::u16 ? "u16" : "i32") + "_index_" +
         std::to_string(c.threads) + "_threads";
}
// For gtest's messages.
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_str(c);
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return case_str(info.param);
}

class Golden : public testing::TestWithParam<Case> {};

TEST_P(Golden, MatchesPyTorch) {
  const json& j = golden();
  const int64_t B = j["dims"]["B"], F = j["dims"]["F"], H = j["dims"]["H"], L = j["dims"]["L"],
                K = j["dims"]["K"];
  const std::vector<int32_t> ptr_v = ints(j["batch"]["ptr"]), idx_v = ints(j["batch"]["idx"]);
  const std::vector<float> val_v = floats(j["batch"]["val"]);
  const std::vector<float> tgt_v = floats(j["batch"]["targets"]);
  const int64_t nnz = ptr_v.back();
  ASSERT_EQ(static_cast<int64_t>(ptr_v.size()), B + 1);
  ASSERT_EQ(static_cast<int64_t>(idx_v.size()), nnz);
  ASSERT_EQ(static_cast<int64_t>(tgt_v.size()), B * L);
  // The batch's capacity N exceeds its nonzeros, as in a real session: the
  // entries past ptr[B] hold junk that sparse_linear must not read.
  const int64_t N = nnz + 4;

  // ---- the graph, as runtime/train/xmc_model.cpp wires it ----
  Graph g;
  const TensorId ptr = g.add_tensor({"batch.ptr", DType::i32, {B + 1}, Role::input});
  const TensorId idx = g.add_tensor({"batch.idx", DType::i32, {N}, Role::input});
  const TensorId val = g.add_tensor({"batch.val", DType::f32, {N}, Role::input});
  const TensorId tgt = g.add_tensor({"batch.targets", DType::f32, {B, L}, Role::input});
  auto weight = [&](const char* name, DType dt, Shape shape, bool trainable) {
    TensorDesc d{name, dt, std::move(shape), Role::weight};
    d.trainable = trainable;
    return g.add_tensor(d);
  };
  const TensorId W1 = weight("hidden.weight", DType::f32, {F, H}, true);
  const TensorId b1 = weight("hidden.bias", DType::f32, {H}, true);
  const TensorId index = weight("head.index", GetParam().index_dtype, {L, K}, false);
  const TensorId w2 = weight("head.weight", DType::f32, {L, K}, true);
  const TensorId b2 = weight("head.bias", DType::f32, {L}, true);
  const TensorId pre = g.add_op1("sparse_linear", {ptr, idx, val, W1, b1}, {}, "hidden.pre");
  const TensorId hidden = g.add_op1("relu", {pre}, {}, "hidden.act");
  const TensorId logits = g.add_op1("ffi_linear", {hidden, index, w2, b2}, {}, "logits");
  const TensorId loss = g.add_op1("bce_logits", {logits, tgt}, {}, "loss");
  const std::vector<WeightGrad> grads = build_backward(g, loss);
  ASSERT_EQ(grads.size(), 4u);
  std::map<TensorId, TensorId> grad_of;
  for (const WeightGrad& wg : grads) grad_of[wg.weight] = wg.grad;
  ASSERT_EQ(grad_of.size(), 4u);
  const TensorId dW1 = grad_of.at(W1), db1 = grad_of.at(b1), dw2 = grad_of.at(w2),
                 db2 = grad_of.at(b2);
  const TensorId dW1_rows = g.tensor(dW1).sparse_rows;
  ASSERT_NE(dW1_rows, kNoTensor) << "sparse_linear's weight gradient should be row-sparse";
  const int64_t R = g.tensor(dW1).shape[0];
  ASSERT_EQ(g.tensor(dW1).shape, (Shape{std::min(F, N), H}));
  for (TensorId t : {db1, dw2, db2}) ASSERT_EQ(g.tensor(t).sparse_rows, kNoTensor);

  OptimizerConfig opt;
  opt.kind = OptimizerConfig::Kind::adam;
  opt.lr = j["adam"]["lr"];
  opt.beta1 = j["adam"]["beta1"];
  opt.beta2 = j["adam"]["beta2"];
  opt.eps = j["adam"]["eps"];
  opt.weight_decay = j["adam"]["weight_decay"];
  append_optimizer(g, grads, opt);

  for (TensorId t : {loss, logits, hidden, dW1_rows, dW1, db1, dw2, db2}) g.mark_output(t);

  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = GetParam().threads;
  cfg.deterministic = GetParam().threads == 1;
  cfg.train = false;  // the graph above carries its own backward pass and updates
  Session ex(std::make_shared<Model>(model_from_graph(g)), cfg);

  // ---- weights, optimizer state, batch ----
  auto write_f32 = [&](TensorId t, const std::vector<float>& v) {
    ASSERT_EQ(static_cast<int64_t>(v.size()), g.tensor(t).numel()) << g.tensor(t).name;
    ex.write_tensor(g.tensor(t).name, v.data(), v.size() * 4);
  };
  const std::vector<float> W1_0 = floats(j["init"]["W1"]);
  write_f32(W1, W1_0);
  write_f32(b1, floats(j["init"]["b1"]));
  write_f32(w2, floats(j["init"]["w2"]));
  write_f32(b2, floats(j["init"]["b2"]));
  const std::vector<int32_t> index_v = ints(j["init"]["index"]);
  ASSERT_EQ(static_cast<int64_t>(index_v.size()), L * K);
  if (GetParam().index_dtype == DType::u16) {
    std::vector<uint16_t> u(index_v.begin(), index_v.end());
    ex.write_tensor("head.index", u.data(), u.size() * 2);
  } else {
    ex.write_tensor("head.index", index_v.data(), index_v.size() * 4);
  }
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (d.role != Role::optimizer_state) continue;
    std::vector<std::byte> zeros(d.bytes());
    ex.write_tensor(d.name, zeros.data(), zeros.size());
  }
  auto* ptr_s = static_cast<int32_t*>(ex.input_buffer(g.tensor(ptr).name, -1));
  auto* idx_s = static_cast<int32_t*>(ex.input_buffer(g.tensor(idx).name, -1));
  auto* val_s = static_cast<float*>(ex.input_buffer(g.tensor(val).name, -1));
  std::memcpy(ptr_s, ptr_v.data(), ptr_v.size() * 4);
  for (int64_t i = 0; i < N; ++i) {
    // Junk past ptr[B]: a feature the batch leaves untouched, a huge value.
    idx_s[i] = i < nnz ? idx_v[static_cast<size_t>(i)] : 3;
    val_s[i] = i < nnz ? val_v[static_cast<size_t>(i)] : 1000.0f;
  }
  std::memcpy(ex.input_buffer(g.tensor(tgt).name, -1), tgt_v.data(), tgt_v.size() * 4);

  // ---- one forward and backward pass, no update ----
  // Not a training program: leaves the step counter at 0.
  const int grad_prog = ex.compile({loss, logits, hidden, dW1_rows, dW1, db1, dw2, db2}, false, false);
  ex.run_compiled(grad_prog);
  ASSERT_EQ(ex.optimizer_step(), 0u);
  auto out = [&](TensorId t) { return static_cast<const float*>(ex.staged(t)); };
  expect_close("hidden", out(hidden), floats(j["forward"]["hidden"]));
  expect_close("logits", out(logits), floats(j["forward"]["logits"]));
  expect_close("loss", out(loss), {static_cast<float>(j["forward"]["loss"].get<double>())});
  expect_close("grad b1", out(db1), floats(j["grad"]["b1"]));
  expect_close("grad w2", out(dw2), floats(j["grad"]["w2"]));
  expect_close("grad b2", out(db2), floats(j["grad"]["b2"]));

  // dW1: pooch holds the rows the batch touches, torch the dense [F,H].
  const std::vector<float> dW1_torch = floats(j["grad"]["W1"]);
  const auto* rows = static_cast<const int32_t*>(ex.staged(dW1_rows));
  const std::set<int32_t> batch_features(idx_v.begin(), idx_v.end());
  ASSERT_EQ(rows[0], static_cast<int32_t>(batch_features.size()));
  ASSERT_LE(rows[0], R);
  std::vector<int32_t> listed(rows + 1, rows + 1 + rows[0]);
  EXPECT_EQ(listed, std::vector<int32_t>(batch_features.begin(), batch_features.end()))
      << "the rows of dW1 should be the batch's distinct features, ascending";
  std::vector<float> dW1_touched, dW1_torch_touched;
  for (int32_t i = 0; i < rows[0]; ++i) {
    const int32_t f = rows[1 + i];
    ASSERT_TRUE(f >= 0 && f < F) << "row id " << f;
    for (int64_t h = 0; h < H; ++h) {
      dW1_touched.push_back(out(dW1)[i * H + h]);
      dW1_torch_touched.push_back(dW1_torch[static_cast<size_t>(f * H + h)]);
    }
  }
  expect_close("grad W1 (touched rows)", dW1_touched.data(), dW1_torch_touched);
  for (int64_t f = 0; f < F; ++f) {
    if (batch_features.count(static_cast<int32_t>(f))) continue;
    for (int64_t h = 0; h < H; ++h)
      EXPECT_EQ(dW1_torch[static_cast<size_t>(f * H + h)], 0.0f)
          << "torch has a gradient for W1 row " << f << ", which the batch does not touch";
  }

  // ---- 10 Adam steps on the same batch ----
  const int train = ex.compile({loss}, true, true);
  ASSERT_TRUE(ex.schedule_of(train).training);
  const int steps = j["adam"]["steps"];
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    ex.run_compiled(train);
    ASSERT_EQ(ex.optimizer_step(), static_cast<uint64_t>(s + 1)) << "Adam's t should count 1, 2, ...";
    losses.push_back(*out(loss));
  }
  expect_close("adam losses", losses.data(), floats(j["adam"]["losses"]));
  auto read_f32 = [&](TensorId t) {
    std::vector<float> v(static_cast<size_t>(g.tensor(t).numel()));
    const std::vector<std::byte> b = ex.read_tensor(g.tensor(t).name);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
  };
  const json& fin = j["adam"]["final"];
  const std::vector<float> W1_final = read_f32(W1);
  expect_close("final W1", W1_final.data(), floats(fin["W1"]));
  expect_close("final b1", read_f32(b1).data(), floats(fin["b1"]));
  expect_close("final w2", read_f32(w2).data(), floats(fin["w2"]));
  expect_close("final b2", read_f32(b2).data(), floats(fin["b2"]));
  // Lazy Adam leaves the rows the batch never touches bit for bit unchanged.
  for (int64_t f = 0; f < F; ++f) {
    if (batch_features.count(static_cast<int32_t>(f))) continue;
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = static_cast<size_t>(f * H + h);
      EXPECT_EQ(W1_final[i], W1_0[i]) << "W1 row " << f << " changed, but no batch touches it";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(XmcTiny, Golden,
                         testing::Values(Case{DType::u16, 1}, Case{DType::i32, 1},
                                         Case{DType::u16, 2}),
                         case_name);

// Prints the worst relative error per quantity over all cases.
class ReportErrors : public testing::Environment {
 public:
  void TearDown() override {
    if (max_errors().empty()) return;
    std::printf("max relative error vs PyTorch (|a-b| / max(|b|, %g), tolerance %g):\n", kFloor,
                kRelTol);
    for (const auto& [name, e] : max_errors()) std::printf("  %-24s %.3g\n", name.c_str(), e);
  }
};
const auto* const kReport = testing::AddGlobalTestEnvironment(new ReportErrors);

}  // namespace
