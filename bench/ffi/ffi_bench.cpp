// bench/ffi: the fixed fan-in output layer's forward + backward with its loss
// (BCE over label-CSR targets) on the CPU kernels, at one shape, in one of
// two forms, one form per process (so that the process's peak RSS is the
// form's own; bench/ffi/run.py runs both and the PyTorch peer side by side):
//
//   unfused  ffi_linear -> bce_logits_csr (+ _grad) -> ffi_grad_input,
//            ffi_grad_weight: the [B, L] logits and their gradient exist
//   fused    ffi_loss_grad, which gives the loss too: label tiles, no
//            [B, L] array, one pass over the logits
//   evaluate ffi_loss alone (the loss of an evaluate program)
//   predict  ffi_topk with k = 5 (the top labels of a forward program)
//
//   pooch-bench-ffi --form fused|unfused|evaluate|predict [--batch 128] [--hidden 4096]
//                   [--labels 670091] [--fan-in 32] [--threads 2] [--steps 3]
//
// Prints one JSON line: seconds per step (the median of --steps after one
// warm-up step), the loss, and the bytes the form allocates beyond the
// layer's own arrays (h, index, w, b, dh, dw, db and the targets).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

using namespace pooch::kern;
using pooch::DType;

namespace {

// Every array 256-byte aligned, as the CPU backend's arena places every
// tensor and workspace (BackendCaps::alignment). In std::vector's glibc
// blocks (16 bytes into a page) each 64-byte vector of the kernel's rows of
// hT and dhT (its workspace) straddled two cache lines: the fused step took
// 0.23 s instead of 0.19 s (pooch-bench-ffi --form fused, alternated,
// 2026-12-05), a penalty no session pays.
template <class T>
struct ArenaAligned {
  using value_type = T;
  static constexpr size_t kAlign = 256;
  ArenaAligned() = default;
  template <class U>
  ArenaAligned(const ArenaAligned<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (std::max<size_t>(n * sizeof(T), 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const ArenaAligned<U>&) const {
    return true;
  }
};
template <class T>
using Buf = std::vector<T, ArenaAligned<T>>;

TensorView view(void* p, DType dt, std::initializer_list<int64_t> shape) {
  TensorView v;
  v.data = p;
  v.dtype = dt;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  return v;
}

// A kernel launch with its own workspace (sized once, as the planner would).
struct Launch {
  const KernelVariant* k = nullptr;
  KernelArgs a;
  Buf<std::byte> ws;
  size_t ws_bytes = 0;

  // The first variant of the op that takes these operands, as the planner
  // chooses (choose_kernel).
  void prepare(const char* op) {
    for (const KernelVariant& v : cpu_kernels())
      if (std::strcmp(v.op, op) == 0 && (!v.supports || v.supports(a))) {
        k = &v;
        break;
      }
    if (!k) {
      fmt::print(stderr, "pooch-bench-ffi: no CPU kernel of {} takes these operands\n", op);
      std::exit(1);
    }
    ws_bytes = k->workspace ? k->workspace(a) : 0;
    ws.resize(ws_bytes);
    a.workspace = ws.data();
    a.workspace_bytes = ws_bytes;
  }
  void run() const { k->fn(a); }
};

Launch launch(const char* op, std::vector<TensorView> in, std::vector<TensorView> out,
              const KernelContext* ctx,
              std::initializer_list<std::pair<const char*, double>> attrs) {
  Launch l;
  for (const TensorView& v : in) l.a.in[l.a.n_in++] = v;
  for (const TensorView& v : out) l.a.out[l.a.n_out++] = v;
  for (const auto& [name, value] : attrs) l.a.attrs.set(name, value);
  l.a.ctx = ctx;
  l.prepare(op);
  return l;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string form = "fused";
  int64_t B = 128, H = 4096, L = 670091, K = 32;
  int threads = 2, steps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "pooch-bench-ffi: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--form")
      form = next();
    else if (a == "--batch")
      B = std::atoll(next());
    else if (a == "--hidden")
      H = std::atoll(next());
    else if (a == "--labels")
      L = std::atoll(next());
    else if (a == "--fan-in")
      K = std::atoll(next());
    else if (a == "--threads")
      threads = std::atoi(next());
    else if (a == "--steps")
      steps = std::atoi(next());
    else {
      fmt::print(stderr, "pooch-bench-ffi: unknown argument {}\n", a);
      return 2;
    }
  }
  if (form != "fused" && form != "unfused" && form != "evaluate" && form != "predict") {
    fmt::print(stderr,
               "pooch-bench-ffi: --form must be fused, unfused, evaluate or predict, not {}\n",
               form);
    return 2;
  }
  if (B < 1 || H < 1 || L < 1 || K < 1 || K > H || threads < 1 || steps < 1) {
    fmt::print(stderr, "pooch-bench-ffi: sizes, --threads and --steps must be positive, K <= H\n");
    return 2;
  }
  // The layer's arrays, as the xmc model initialises them; 5 labels per row.
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buf<float> h(B * H), w(L * K), b(L, -std::log(static_cast<float>(L)));
  for (float& v : h) v = std::max(0.0f, u(rng));  // post-ReLU activations
  const float ws = 1.0f / std::sqrt(static_cast<float>(K));
  for (float& v : w) v = ws * u(rng);
  const bool u16 = H <= 65536;
  Buf<uint16_t> idx16(u16 ? L * K : 0);
  Buf<int32_t> idx32(u16 ? 0 : L * K);
  std::uniform_int_distribution<int64_t> pick(0, H - 1);
  for (int64_t i = 0; i < L * K; ++i)
    u16 ? void(idx16[i] = static_cast<uint16_t>(pick(rng))) : void(idx32[i] = pick(rng));
  Buf<int32_t> lptr{0}, lidx;
  std::uniform_int_distribution<int64_t> label(0, L - 1);
  for (int64_t r = 0; r < B; ++r) {
    std::vector<int32_t> row;
    while (row.size() < std::min<size_t>(5, L)) {
      const auto l = static_cast<int32_t>(label(rng));
      if (std::find(row.begin(), row.end(), l) == row.end()) row.push_back(l);
    }
    lidx.insert(lidx.end(), row.begin(), row.end());
    lptr.push_back(static_cast<int32_t>(lidx.size()));
  }
  Buf<float> dh(B * H), dw(L * K), db(L);
  float loss = 0;

  KernelContext ctx;
  ctx.threads = threads;
  const TensorView th = view(h.data(), DType::f32, {B, H});
  const TensorView ti =
      u16 ? view(idx16.data(), DType::u16, {L, K}) : view(idx32.data(), DType::i32, {L, K});
  const TensorView tw = view(w.data(), DType::f32, {L, K});
  const TensorView tb = view(b.data(), DType::f32, {L});
  const TensorView tp = view(lptr.data(), DType::i32, {B + 1});
  const TensorView tl = view(lidx.data(), DType::i32, {static_cast<int64_t>(lidx.size())});
  const TensorView tloss = view(&loss, DType::f32, {});
  const TensorView tdh = view(dh.data(), DType::f32, {B, H});
  const TensorView tdw = view(dw.data(), DType::f32, {L, K});
  const TensorView tdb = view(db.data(), DType::f32, {L});

  std::vector<Launch> step;
  Buf<float> logits, dlogits;  // unfused only
  Buf<float> top_v(B * 5);
  Buf<int32_t> top_i(B * 5);
  if (form == "evaluate") {
    step.push_back(launch("ffi_loss", {th, ti, tw, tb, tp, tl}, {tloss}, &ctx, {{"loss", 0}}));
  } else if (form == "predict") {
    const TensorView tv = view(top_v.data(), DType::f32, {B, 5});
    const TensorView tix = view(top_i.data(), DType::i32, {B, 5});
    step.push_back(launch("ffi_topk", {th, ti, tw, tb}, {tv, tix}, &ctx, {{"k", 5}}));
  } else if (form == "fused") {
    // A train step runs ffi_loss_grad alone: it gives the loss too.
    step.push_back(launch("ffi_loss_grad", {th, ti, tw, tb, tp, tl}, {tdh, tdw, tdb, tloss}, &ctx,
                          {{"loss", 0}, {"scale", 1.0}, {"with_loss", 1.0}}));
  } else {
    logits.resize(B * L);
    dlogits.resize(B * L);
    const TensorView tz = view(logits.data(), DType::f32, {B, L});
    const TensorView tdz = view(dlogits.data(), DType::f32, {B, L});
    step.push_back(launch("ffi_linear", {th, ti, tw, tb}, {tz}, &ctx, {}));
    step.push_back(launch("bce_logits_csr", {tz, tp, tl}, {tloss}, &ctx, {}));
    step.push_back(launch("bce_logits_csr_grad", {tz, tp, tl}, {tdz}, &ctx, {{"scale", 1.0}}));
    step.push_back(
        launch("ffi_grad_input", {tdz, ti, tw}, {tdh}, &ctx, {{"hidden", static_cast<double>(H)}}));
    step.push_back(launch("ffi_grad_weight", {tdz, th, ti}, {tdw, tdb}, &ctx, {}));
  }
  size_t extra = (logits.size() + dlogits.size()) * sizeof(float);
  for (const Launch& l : step) extra += l.ws_bytes;

  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up
    const double t0 = now();
    for (const Launch& l : step) l.run();
    if (s > 0) times.push_back(now() - t0);
  }
  std::sort(times.begin(), times.end());
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print(
      "{{\"form\": \"{}\", \"batch\": {}, \"hidden\": {}, \"labels\": {}, \"fan_in\": {}, "
      "\"threads\": {}, \"steps\": {}, \"seconds_per_step\": {:.4f}, \"min_seconds\": {:.4f}, "
      "\"loss\": {:.6f}, \"extra_bytes\": {}, \"peak_rss_bytes\": {}, \"kernels\": \"{}\"}}\n",
      form, B, H, L, K, threads, steps, times[times.size() / 2], times.front(), loss, extra,
      static_cast<int64_t>(ru.ru_maxrss) * 1024, [&] {
        std::string s;
        for (const Launch& l : step)
          s += fmt::format("{}{}/{}", s.empty() ? "" : " ", l.k->op, l.k->variant);
        return s;
      }());
  return 0;
}
