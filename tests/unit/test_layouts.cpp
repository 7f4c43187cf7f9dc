// oneDNN's blocked layouts (kern::Layout::nchw16c for activations,
// oihw16i16o for convolution weights; runtime/plan/layouts.h): every CPU
// kernel that declares one gives the plain layout's results (the same bits,
// or within rounding where batch normalisation sums in another order), the
// planner lays out a ResNet's activations and convolution weights blocked
// and its inputs and outputs plain, and a session trains the same with
// blocked layouts as without and reads and writes its weights plain.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/kernel_abi.h"
#include "kernels/common/layout.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/models/build.h"
#include "runtime/plan/layouts.h"
#include "runtime/session/session.h"
#include "runtime/train/model_io.h"

using namespace pooch;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct KernelCase {
  const char* op;
  std::vector<std::vector<int64_t>> in, out;
  std::vector<std::pair<const char*, double>> attrs;
  double rtol;  // 0: bitwise
};

// One call of the case's CPU kernel, its operands blocked where the kernel
// takes a blocked layout for them (launch_layouts: nchw16c first, then
// oihw16i16o) and their shape allows one, or all plain; the outputs as plain.
std::vector<std::vector<float>> run_case(Backend& b, const KernelCase& c, bool blocked) {
  const kern::KernelVariant* k = b.find_kernel(c.op);
  EXPECT_NE(k, nullptr) << c.op;
  if (k == nullptr) return {};
  kern::KernelArgs a;
  a.n_in = static_cast<int>(c.in.size());
  a.n_out = static_cast<int>(c.out.size());
  for (const auto& [name, value] : c.attrs) a.attrs.set(name, value);
  auto shape_of = [](kern::TensorView& v, const std::vector<int64_t>& shape) {
    v.dtype = DType::f32;
    v.ndim = static_cast<int>(shape.size());
    for (int i = 0; i < v.ndim; ++i) v.shape[i] = shape[static_cast<size_t>(i)];
  };
  for (int i = 0; i < a.n_in; ++i) shape_of(a.in[i], c.in[static_cast<size_t>(i)]);
  for (int j = 0; j < a.n_out; ++j) shape_of(a.out[j], c.out[static_cast<size_t>(j)]);
  const LaunchLayouts takes = launch_layouts(k, a);
  auto layout_of = [&](const kern::TensorView& v, uint32_t operand_bit) {
    if (!blocked) return kern::Layout::plain;
    for (auto [mask, l] : {std::pair{takes.nchw16c, kern::Layout::nchw16c},
                           std::pair{takes.oihw16i16o, kern::Layout::oihw16i16o}})
      if ((mask & operand_bit) && kern::fits_layout(l, v.shape, v.ndim)) return l;
    return kern::Layout::plain;
  };
  std::byte* next = b.arena_base();
  auto place = [&](kern::TensorView& v, uint32_t operand_bit) {
    v.layout = layout_of(v, operand_bit);
    v.data = next;
    next += (static_cast<size_t>(v.numel()) * 4 + 255) / 256 * 256;
  };
  for (int i = 0; i < a.n_in; ++i) {
    place(a.in[i], kern::in_bit(i));
    std::vector<float> v(static_cast<size_t>(a.in[i].numel()));
    // Positive where a variance is read (batch normalisation's last inputs).
    for (size_t e = 0; e < v.size(); ++e)
      v[e] = 0.5f + std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(i));
    if (a.in[i].layout != kern::Layout::plain)
      kern::relayout(a.in[i].layout, a.in[i].shape, v.data(), a.in[i].as<float>(), false);
    else
      std::memcpy(a.in[i].data, v.data(), v.size() * 4);
  }
  for (int j = 0; j < a.n_out; ++j) place(a.out[j], kern::out_bit(j));
  int n_blocked = 0;
  for (int i = 0; i < a.n_in; ++i) n_blocked += a.in[i].layout != kern::Layout::plain;
  for (int j = 0; j < a.n_out; ++j) n_blocked += a.out[j].layout != kern::Layout::plain;
  EXPECT_EQ(n_blocked > 0, blocked);
  EXPECT_TRUE(k->supports == nullptr || k->supports(a));
  kern::KernelContext ctx;
  ctx.training = 1;
  a.ctx = &ctx;
  a.device = b.kernel_device();
  a.workspace_bytes = k->workspace ? k->workspace(a) : 0;
  a.workspace = next;
  EXPECT_LE(static_cast<size_t>(next - b.arena_base()) + a.workspace_bytes, 64 * kMiB);
  b.launch(Stream::compute, *k, a);
  b.stream_sync(Stream::compute);
  std::vector<std::vector<float>> outs;
  for (int j = 0; j < a.n_out; ++j) {
    std::vector<float> v(static_cast<size_t>(a.out[j].numel()));
    if (a.out[j].layout != kern::Layout::plain)
      kern::relayout(a.out[j].layout, a.out[j].shape, a.out[j].as<const float>(), v.data(), true);
    else
      std::memcpy(v.data(), a.out[j].data, v.size() * 4);
    outs.push_back(std::move(v));
  }
  return outs;
}

TEST(Layouts, EveryBlockedKernelGivesThePlainResult) {
  CpuBackendParams p;
  p.threads = 2;
  auto b = make_cpu_backend(p);
  b->arena_reserve(64 * kMiB);
  b->host_pool_reserve(kMiB);
  const std::vector<int64_t> x{2, 32, 6, 6}, w{32, 32, 3, 3}, c{32}, half{2, 32, 3, 3}, rows{2, 32};
  const std::vector<std::pair<const char*, double>> conv{
      {"kh", 3}, {"kw", 3}, {"pad_h", 1}, {"pad_w", 1}},
      pool{{"kh", 2}, {"kw", 2}, {"stride_h", 2}, {"stride_w", 2}},
      bn{{"eps", 1e-5}, {"momentum", 0.1}};
  const std::vector<int64_t> x7{2, 32, 7, 7}, wg{48, 16, 3, 3}, c48{48}, y4{2, 48, 4, 4},
      rgb{2, 3, 6, 6}, w3{32, 3, 3, 3}, p4{2, 32, 4, 4};
  const std::vector<std::pair<const char*, double>> grouped{
      {"kh", 3},    {"kw", 3},    {"stride_h", 2}, {"stride_w", 2}, {"pad_h", 2},
      {"pad_w", 2}, {"dil_h", 2}, {"dil_w", 2},    {"groups", 2}};
  auto plus = [](std::vector<std::pair<const char*, double>> a,
                 std::vector<std::pair<const char*, double>> more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const auto grouped_in = plus(grouped, {{"in_h", 7}, {"in_w", 7}});
  const std::vector<int64_t> w16{32, 16, 3, 3};
  const auto two_groups = plus(conv, {{"groups", 2}});
  const auto grouped_w = grouped;
  const std::vector<std::pair<const char*, double>> stem_pool{
      {"kh", 3}, {"kw", 3}, {"stride_h", 2}, {"stride_w", 2}, {"pad_h", 1}, {"pad_w", 1}};
  const KernelCase cases[] = {
      {"conv2d", {x, w, c}, {x}, conv, 0},
      {"conv2d_grad_input", {x, w}, {x}, conv, 0},
      {"conv2d_grad_weight", {x, x}, {w, c}, conv, 0},
      // Batch normalisation sums a block's 16 channels lane by lane: the
      // same terms in another order.
      {"batchnorm", {x, c, c, c, c}, {x, c, c}, bn, 1e-5},
      {"batchnorm_replay", {x, c, c}, {x}, bn, 1e-5},
      {"batchnorm_grad", {x, x, c, c, c}, {x, c, c}, bn, 1e-4},
      {"maxpool2d", {x}, {half}, pool, 0},
      {"maxpool2d_grad", {half, x, half}, {x}, pool, 0},
      {"global_avgpool", {x}, {rows}, {}, 1e-6},
      {"global_avgpool_grad", {rows}, {x}, {}, 1e-6},
      {"relu", {x}, {x}, {}, 0},
      {"relu_grad", {x, x}, {x}, {}, 0},
      {"add", {x, x}, {x}, {}, 0},
      // Strided, grouped and dilated; an image of 3 channels (plain) into 32
      // (blocked); the stem's padded 3 x 3 max pooling.
      {"conv2d", {x7, wg, c48}, {y4}, grouped, 0},
      {"conv2d_grad_input", {y4, wg}, {x7}, grouped_in, 0},
      {"conv2d_grad_weight", {y4, x7}, {wg, c48}, grouped_w, 0},
      {"conv2d", {rgb, w3, c}, {x}, conv, 0},
      {"conv2d_grad_weight", {x, rgb}, {w3, c}, conv, 0},
      {"maxpool2d", {x7}, {p4}, stem_pool, 0},
      {"maxpool2d_grad", {p4, x7, p4}, {x7}, stem_pool, 0},
      // Two groups of 16 output channels: the weights in gOIhw16i16o.
      {"conv2d", {x, w16, c}, {x}, two_groups, 0},
      {"conv2d_grad_input", {x, w16}, {x}, two_groups, 0},
      {"conv2d_grad_weight", {x, x}, {w16, c}, two_groups, 0},
  };
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const KernelCase& kc = cases[ci];
    SCOPED_TRACE(fmt::format("case {}: {}", ci, kc.op));
    const kern::KernelVariant* k = b->find_kernel(kc.op);
    ASSERT_NE(k, nullptr);
    EXPECT_NE(k->blocked, 0u) << "declares no blocked operand";
    const auto plain = run_case(*b, kc, false), blocked = run_case(*b, kc, true);
    ASSERT_EQ(plain.size(), blocked.size());
    for (size_t j = 0; j < plain.size(); ++j) {
      ASSERT_EQ(plain[j].size(), blocked[j].size());
      double err = 0, norm = 0;
      for (size_t e = 0; e < plain[j].size(); ++e) {
        err = std::max(err, static_cast<double>(std::fabs(plain[j][e] - blocked[j][e])));
        norm = std::max(norm, static_cast<double>(std::fabs(plain[j][e])));
      }
      if (kc.rtol == 0)
        EXPECT_EQ(std::memcmp(plain[j].data(), blocked[j].data(), plain[j].size() * 4), 0)
            << "output " << j << " differs by up to " << err;
      else
        EXPECT_LE(err, kc.rtol * std::max(norm, 1.0)) << "output " << j;
    }
  }
}

// A convolution takes its weights in oihw16i16o only where oneDNN has the
// layout for them: grouped, only with whole blocks of 16 output channels a
// group (its gOIhw16i16o); `supports` says so and launch_layouts asks it.
TEST(Layouts, GroupedWeightsAreBlockedOnlyInWholeBlocksOfAGroup) {
  CpuBackendParams p;
  auto b = make_cpu_backend(p);
  const kern::KernelVariant* k = b->find_kernel("conv2d");
  ASSERT_NE(k, nullptr);
  auto args = [](int64_t out, int64_t groups) {
    kern::KernelArgs a;
    a.n_in = 2;
    a.n_out = 1;
    const int64_t in = 32;
    const int64_t shapes[3][4] = {{2, in, 6, 6}, {out, in / groups, 1, 1}, {2, out, 6, 6}};
    kern::TensorView* v[3] = {&a.in[0], &a.in[1], &a.out[0]};
    for (int i = 0; i < 3; ++i) {
      v[i]->ndim = 4;
      for (int d = 0; d < 4; ++d) v[i]->shape[d] = shapes[i][d];
    }
    a.attrs.set("kh", 1);
    a.attrs.set("kw", 1);
    a.attrs.set("groups", static_cast<double>(groups));
    return a;
  };
  EXPECT_EQ(launch_layouts(k, args(64, 1)).oihw16i16o, kern::in_bit(1));
  EXPECT_EQ(launch_layouts(k, args(64, 2)).oihw16i16o, kern::in_bit(1));  // 32 a group
  EXPECT_EQ(launch_layouts(k, args(48, 2)).oihw16i16o, 0u);               // 24 a group
  EXPECT_EQ(launch_layouts(k, args(64, 1)).nchw16c, kern::in_bit(0) | kern::out_bit(0));
}

ModelSpec resnet16() {
  return spec_from_json(
      R"({"family": "resnet", "depth": 18, "width": 16, "stem": "small", "classes": 10,
          "input": {"channels": 3, "height": 12, "width": 12}, "batch": 4})",
      "resnet16");
}

void fill(Session& s, int step) {
  for (const IoTensor& io : s.model().inputs) {
    const TensorDesc& d = s.graph().tensor(io.id);
    const auto n = static_cast<size_t>(d.numel());
    if (d.dtype == DType::f32) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = std::sin(0.1f * static_cast<float>(i) + static_cast<float>(step));
      s.set_input(io.name, v.data(), n * 4);
    } else {
      std::vector<int64_t> v(n);  // class ids
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>((i * 3 + step) % 10);
      s.set_input(io.name, v.data(), n * dtype_size(d.dtype));
    }
  }
}

TEST(Layouts, AResNetTrainsWithBlockedActivationsAndWeightsAsWithPlainOnes) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session blocked(build_model(resnet16()), cfg);
  cfg.blocked_layouts = false;
  Session plain(build_model(resnet16()), cfg);

  // Every convolution's output is blocked, and so is what runs between two
  // convolutions; the image and the logits stay plain. Every convolution's
  // weights whose channels are in whole blocks (all but the 3-channel
  // stem's), their gradients and Adam's moments are in oihw16i16o, in every program.
  int conv_out_blocked = 0, convs = 0, weights_blocked = 0, updates_blocked = 0;
  for (const Session* s : {&blocked, &plain})
    for (ProgramKind pk : {ProgramKind::train_step, ProgramKind::evaluate})
      for (const Launch& l : s->schedule(pk)->launches) {
        const Node& nd = s->graph().nodes()[static_cast<size_t>(l.node)];
        for (size_t i = 0; i < nd.inputs.size(); ++i) {
          const TensorDesc& d = s->graph().tensor(nd.inputs[i]);
          const kern::Layout want =
              s == &plain || d.role == Role::input || d.shape.size() != 4 ? kern::Layout::plain
              : d.role == Role::weight || d.role == Role::optimizer_state
                  ? (d.shape[1] == 3 ? kern::Layout::plain : kern::Layout::oihw16i16o)
                  : l.args.in[i].layout;
          EXPECT_EQ(l.args.in[i].layout, want) << nd.op << " input " << i << " " << d.name;
        }
        if (s == &blocked && nd.op == "adam_update") {
          bool all = true;
          for (int i = 0; i < 4; ++i) all = all && l.args.in[i].layout == kern::Layout::oihw16i16o;
          updates_blocked += all;
        }
        if (nd.op != "conv2d") continue;
        if (pk == ProgramKind::train_step) ++convs;
        if (s != &blocked) continue;
        conv_out_blocked +=
            pk == ProgramKind::train_step && l.args.out[0].layout == kern::Layout::nchw16c;
        weights_blocked +=
            pk == ProgramKind::train_step && l.args.in[1].layout == kern::Layout::oihw16i16o;
      }
  EXPECT_GT(convs, 0);
  EXPECT_EQ(conv_out_blocked * 2, convs) << "every convolution of the blocked session";
  EXPECT_EQ(weights_blocked * 2, convs - 2) << "every convolution but the stem's";
  EXPECT_EQ(updates_blocked, weights_blocked) << "their updates";

  for (int step = 0; step < 3; ++step) {
    fill(blocked, step);
    fill(plain, step);
    blocked.run(ProgramKind::train_step);
    plain.run(ProgramKind::train_step);
    float lb = 0, lp = 0;
    blocked.get_output("loss", &lb, sizeof lb);
    plain.get_output("loss", &lp, sizeof lp);
    EXPECT_NEAR(lb, lp, 1e-5 * std::fabs(lp)) << "step " << step;
  }
  for (size_t t = 0; t < blocked.graph().num_tensors(); ++t) {
    const TensorDesc& d = blocked.graph().tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight) continue;
    const auto wb = blocked.read_tensor(d.name), wp = plain.read_tensor(d.name);
    ASSERT_EQ(wb.size(), wp.size());
    const auto* fb = reinterpret_cast<const float*>(wb.data());
    const auto* fp = reinterpret_cast<const float*>(wp.data());
    double err = 0, norm = 0;
    for (size_t e = 0; e < wb.size() / 4; ++e) {
      err += (fb[e] - fp[e]) * static_cast<double>(fb[e] - fp[e]);
      norm += fp[e] * static_cast<double>(fp[e]);
    }
    EXPECT_LE(std::sqrt(err), 1e-4 * std::sqrt(norm) + 1e-7) << d.name;
  }

  // Weights and moments written to the blocked session from the plain one's
  // read back bit for bit, and the two evaluate alike: writes and reads
  // go through the blocked layout and back.
  for (size_t t = 0; t < plain.graph().num_tensors(); ++t) {
    const TensorDesc& d = plain.graph().tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight && d.role != Role::optimizer_state) continue;
    const auto v = plain.read_tensor(d.name);
    blocked.write_tensor(d.name, v.data(), v.size());
    EXPECT_EQ(blocked.read_tensor(d.name), v) << d.name;
  }
  // A checkpoint of the blocked session holds the plain bytes: a session
  // without blocked layouts restores the same weights and moments.
  const std::string ckpt = testing::TempDir() + "/layouts.ckpt";
  save_session(blocked, ckpt, true);
  Session restored(build_model(resnet16()), cfg);  // cfg: blocked layouts off
  restore_tensors(restored, load_model_file(ckpt).file, true);
  std::remove(ckpt.c_str());
  for (size_t t = 0; t < plain.graph().num_tensors(); ++t) {
    const TensorDesc& d = plain.graph().tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight && d.role != Role::optimizer_state) continue;
    EXPECT_EQ(restored.read_tensor(d.name), blocked.read_tensor(d.name)) << d.name;
  }
  fill(blocked, 7);
  fill(plain, 7);
  blocked.run(ProgramKind::evaluate);
  plain.run(ProgramKind::evaluate);
  float lb = 0, lp = 0;
  blocked.get_output("loss", &lb, sizeof lb);
  plain.get_output("loss", &lp, sizeof lp);
  EXPECT_NEAR(lb, lp, 1e-5 * std::fabs(lp));
}

}  // namespace
