// Activations in oneDNN's blocked layout (kern::Layout::nchw16c,
// runtime/plan/layouts.h): every CPU kernel that declares it takes it gives
// the plain layout's results (the same bits, or within rounding where
// batch normalisation sums in another order), the planner lays out a
// ResNet's activations blocked and its inputs, weights and outputs plain,
// and a session trains the same with blocked layouts as without.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/kernel_abi.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/models/build.h"
#include "runtime/session/session.h"

using namespace pooch;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// x[N, C, H, W] plain -> nchw16c and back (C a multiple of 16).
std::vector<float> relayout(const std::vector<float>& from, const std::vector<int64_t>& s,
                            bool to_blocked) {
  const int64_t N = s[0], C = s[1], S = s[2] * s[3];
  std::vector<float> to(from.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < S; ++p) {
        const auto plain = static_cast<size_t>((n * C + c) * S + p);
        const auto blocked = static_cast<size_t>(((n * (C / 16) + c / 16) * S + p) * 16 + c % 16);
        to[to_blocked ? blocked : plain] = from[to_blocked ? plain : blocked];
      }
  return to;
}

struct KernelCase {
  const char* op;
  std::vector<std::vector<int64_t>> in, out;
  std::vector<std::pair<const char*, double>> attrs;
  double rtol;  // 0: bitwise
};

bool blockable(const std::vector<int64_t>& s) {
  return s.size() == 4 && s[1] % 16 == 0;
}

// One call of the case's CPU kernel, its operands blocked (where the kernel
// takes nchw16c and the operand is 4-D) or all plain; the outputs as plain.
std::vector<std::vector<float>> run_case(Backend& b, const KernelCase& c, bool blocked) {
  const kern::KernelVariant* k = b.find_kernel(c.op);
  EXPECT_NE(k, nullptr) << c.op;
  if (k == nullptr) return {};
  kern::KernelArgs a;
  a.n_in = static_cast<int>(c.in.size());
  a.n_out = static_cast<int>(c.out.size());
  std::byte* next = b.arena_base();
  auto place = [&](kern::TensorView& v, const std::vector<int64_t>& shape, bool block) {
    v.dtype = DType::f32;
    v.ndim = static_cast<int>(shape.size());
    for (int i = 0; i < v.ndim; ++i) v.shape[i] = shape[static_cast<size_t>(i)];
    v.layout = block ? kern::Layout::nchw16c : kern::Layout::plain;
    v.data = next;
    next += (static_cast<size_t>(v.numel()) * 4 + 255) / 256 * 256;
  };
  for (int i = 0; i < a.n_in; ++i) {
    const auto& shape = c.in[static_cast<size_t>(i)];
    const bool block = blocked && (k->blocked & kern::in_bit(i)) && blockable(shape);
    place(a.in[i], shape, block);
    std::vector<float> v(static_cast<size_t>(a.in[i].numel()));
    // Positive where a variance is read (batch normalisation's last inputs).
    for (size_t e = 0; e < v.size(); ++e)
      v[e] = 0.5f + std::sin(0.37f * static_cast<float>(e) + 1.3f * static_cast<float>(i));
    if (block) v = relayout(v, shape, true);
    std::memcpy(a.in[i].data, v.data(), v.size() * 4);
  }
  for (int j = 0; j < a.n_out; ++j) {
    const auto& shape = c.out[static_cast<size_t>(j)];
    place(a.out[j], shape, blocked && (k->blocked & kern::out_bit(j)) && blockable(shape));
  }
  int n_blocked = 0;
  for (int i = 0; i < a.n_in; ++i) n_blocked += a.in[i].layout == kern::Layout::nchw16c;
  for (int j = 0; j < a.n_out; ++j) n_blocked += a.out[j].layout == kern::Layout::nchw16c;
  EXPECT_EQ(n_blocked > 0, blocked);
  for (const auto& [name, value] : c.attrs) a.attrs.set(name, value);
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
    std::memcpy(v.data(), a.out[j].data, v.size() * 4);
    if (a.out[j].layout == kern::Layout::nchw16c)
      v = relayout(v, c.out[static_cast<size_t>(j)], false);
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

TEST(Layouts, AResNetTrainsWithBlockedActivationsAsWithPlainOnes) {
  SessionConfig cfg;
  cfg.device = DeviceKind::cpu;
  cfg.threads = 2;
  Session blocked(build_model(resnet16()), cfg);
  cfg.blocked_layouts = false;
  Session plain(build_model(resnet16()), cfg);

  // Every convolution's output is blocked, and so is what runs between two
  // convolutions; the image, the weights and the logits stay plain.
  int conv_out_blocked = 0, convs = 0;
  for (const Session* s : {&blocked, &plain})
    for (const Launch& l : s->schedule(ProgramKind::train_step)->launches) {
      const Node& nd = s->graph().nodes()[static_cast<size_t>(l.node)];
      for (size_t i = 0; i < nd.inputs.size(); ++i) {
        const TensorDesc& d = s->graph().tensor(nd.inputs[i]);
        const bool is_blocked = l.args.in[i].layout == kern::Layout::nchw16c;
        if (s == &plain || d.role == Role::input || d.role == Role::weight || d.shape.size() != 4) {
          EXPECT_FALSE(is_blocked) << nd.op << " input " << i << " " << d.name;
        }
      }
      if (nd.op != "conv2d") continue;
      ++convs;
      if (s == &blocked && l.args.out[0].layout == kern::Layout::nchw16c) ++conv_out_blocked;
    }
  EXPECT_GT(convs, 0);
  EXPECT_EQ(conv_out_blocked * 2, convs) << "every convolution of the blocked session";

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
}

}  // namespace
