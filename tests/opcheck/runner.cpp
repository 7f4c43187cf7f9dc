// The kernel checker's driver (see opcheck.h for what a case is).
//
// For every case: the op runs with its reference kernel on host buffers, then
// with every kernel variant of every backend inside that backend's arena, with
// guard bytes around every buffer; the outputs are compared element by element
// and every byte the kernel may not write is compared with what was there
// before. A differentiable op then gets its backward ops built by its own
// builder; each of them is checked the same way, and the gradients they give
// are compared with central finite differences in double precision.
#include "runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../kernels/common/util.h"
#include "../../kernels/ref/ref_kernels.h"
#include "../../runtime/backend/backend.h"
#ifdef POOCH_HAVE_CUDA
#include "../../runtime/backend/cuda/cuda_backend.h"
#endif
#include "../../runtime/core/error.h"
#include "../../runtime/core/op_registry.h"
#include "opcheck.h"

namespace pooch::opcheck {
namespace {

using kern::KernelArgs;
using kern::KernelVariant;
using kern::TensorView;

// A case that cannot run as written (wrong value count, index out of dtype
// range, too many attributes): a bug in the case file, reported as a failure.
struct CaseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------
// Element access in every dtype

uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (mag >= 0x477FF000u) return sign | 0x7C00u;  // rounds to infinity
  if (mag < 0x38800000u) {                        // below 2^-14: f16 subnormal or zero
    const float a = std::bit_cast<float>(mag);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t r = mag + 0x0FFFu + ((mag >> 13) & 1u) - 0x38000000u;  // nearest even, rebias
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

template <class T>
T ld(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void st(std::byte* p, int64_t i, T v) {
  std::memcpy(p + static_cast<size_t>(i) * sizeof(T), &v, sizeof(T));
}

double load(const std::byte* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32:
      return ld<float>(p, i);
    case DType::f64:
      return ld<double>(p, i);
    case DType::f16:
      return f16_to_f32(ld<uint16_t>(p, i));
    case DType::bf16:
      return bf16_to_f32(ld<uint16_t>(p, i));
    case DType::i32:
      return ld<int32_t>(p, i);
    case DType::u16:
      return ld<uint16_t>(p, i);
    case DType::u8:
      return ld<uint8_t>(p, i);
  }
  return 0;
}

// Integer values must already be in the dtype's range (checked by callers).
void store(std::byte* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::f32:
      st(p, i, static_cast<float>(v));
      return;
    case DType::f64:
      st(p, i, v);
      return;
    case DType::f16:
      st(p, i, f32_to_f16(static_cast<float>(v)));
      return;
    case DType::bf16:
      st(p, i, f32_to_bf16(static_cast<float>(v)));
      return;
    case DType::i32:
      st(p, i, static_cast<int32_t>(v));
      return;
    case DType::u16:
      st(p, i, static_cast<uint16_t>(v));
      return;
    case DType::u8:
      st(p, i, static_cast<uint8_t>(v));
      return;
  }
}

bool int_fits(DType dt, double v) {
  if (v != std::floor(v)) return false;
  switch (dt) {
    case DType::i32:
      return v >= -2147483648.0 && v <= 2147483647.0;
    case DType::u16:
      return v >= 0 && v <= 65535.0;
    case DType::u8:
      return v >= 0 && v <= 255.0;
    default:
      return true;
  }
}

// What outputs hold before a kernel runs, in the reference run and on every
// backend alike: an element a kernel forgets to write then differs from the
// reference, and one it may leave untouched (OPS.md says where) compares
// equal. The float patterns are finite and exactly representable in f32, so
// f64 poison converted to f32 is f32 poison; they are far from any value a
// case produces.
void fill_poison(std::byte* p, DType dt, int64_t n) {
  const float fpoison = std::bit_cast<float>(0xFEEDFACEu);  // about -1.58e38
  for (int64_t i = 0; i < n; ++i) switch (dt) {
      case DType::f32:
        st(p, i, fpoison);
        break;
      case DType::f64:
        st(p, i, static_cast<double>(fpoison));
        break;
      case DType::f16:
        st(p, i, uint16_t{0xDEAD});
        break;
      case DType::bf16:
        st(p, i, uint16_t{0xFEED});
        break;
      case DType::i32:
        st(p, i, int32_t{0x5EADBEEF});
        break;
      case DType::u16:
        st(p, i, uint16_t{0xBEEF});
        break;
      case DType::u8:
        st(p, i, uint8_t{0xA5});
        break;
    }
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A tensor on the host, stored in its own dtype.
struct Buf {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<std::byte> bytes;

  int64_t numel() const { return numel_of(shape); }
  double get(int64_t i) const { return load(bytes.data(), dtype, i); }
  void set(int64_t i, double v) { store(bytes.data(), dtype, i, v); }
};

Buf alloc_buf(DType dt, const Shape& s) {
  Buf b{dt, s, {}};
  b.bytes.resize(static_cast<size_t>(numel_of(s)) * dtype_size(dt));
  return b;
}

Buf poisoned(DType dt, const Shape& s) {
  Buf b = alloc_buf(dt, s);
  fill_poison(b.bytes.data(), dt, b.numel());
  return b;
}

Buf from_values(const std::vector<double>& v, DType dt, const Shape& s, const std::string& what) {
  Buf b = alloc_buf(dt, s);
  if (static_cast<int64_t>(v.size()) != b.numel())
    throw CaseError(fmt::format("{} has {} values for shape {} ({} elements)", what, v.size(),
                                shape_str(s), b.numel()));
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = v[static_cast<size_t>(i)];
    if (!dtype_is_float(dt) && !int_fits(dt, x))
      throw CaseError(fmt::format("{}[{}] = {} is not a valid {}", what, i, x, dtype_name(dt)));
    b.set(i, x);
  }
  return b;
}

// The same values in another dtype (f64 for the interpreter, back to f32 for
// the kernels under test).
Buf convert(const Buf& src, DType dt) {
  Buf b = alloc_buf(dt, src.shape);
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, src.get(i));
  return b;
}

DType compute_dtype(DType dt) {
  return dtype_is_float(dt) ? DType::f64 : dt;
}

TensorView view_of(void* data, DType dt, const Shape& s) {
  TensorView v;
  v.data = data;
  v.dtype = dt;
  v.ndim = static_cast<int>(s.size());
  for (size_t i = 0; i < s.size() && i < kern::kMaxDims; ++i) v.shape[i] = s[i];
  return v;
}

// "y[2,4]" for element 2*cols+4 of a matrix.
std::string element_name(const std::string& tensor, const Shape& s, int64_t flat) {
  if (s.empty()) return tensor;
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? flat % s[d] : 0;
    flat = s[d] ? flat / s[d] : 0;
  }
  return fmt::format("{}[{}]", tensor, fmt::join(idx, ","));
}

std::string num(double v) {
  return fmt::format("{:.9g}", v);
}

kern::KernelAttrs kernel_attrs(const std::string& op, const Attrs& a) {
  kern::KernelAttrs k;
  for (const auto& [name, v] : a.items())
    if (!k.set(name.c_str(), v))
      throw CaseError(
          fmt::format("op '{}': attribute '{}' does not fit the kernel ABI (at most {} "
                      "attributes, names under {} characters)",
                      op, name, kern::kMaxAttrs, sizeof(k.names[0])));
  return k;
}

const KernelVariant* ref_kernel(std::string_view op) {
  for (const KernelVariant& k : kern::ref_kernels())
    if (op == k.op) return &k;
  return nullptr;
}

// Every kernel in the checker sees the same context, so the reference and
// the kernel under test draw the same dropout masks and apply the same
// optimizer step. step 7 and lr_scale 0.5 are deliberately not the defaults:
// a kernel that ignores them (bias correction at t = 1, an unscaled learning
// rate) then differs from the reference.
kern::KernelContext make_context(const Options& opt) {
  kern::KernelContext c;
  c.seed = 0x5EED1234ull;
  c.step = 7;
  c.threads = opt.threads;
  c.training = 1;
  c.lr_scale = 0.5;
  return c;
}

// Runs a kernel on host buffers (the reference kernels; the interpreter).
void run_host(const KernelVariant& k, std::vector<Buf*> in, std::vector<Buf*> out,
              const kern::KernelAttrs& attrs, const kern::KernelContext& ctx) {
  KernelArgs a;
  a.n_in = static_cast<int>(in.size());
  a.n_out = static_cast<int>(out.size());
  for (size_t i = 0; i < in.size(); ++i) a.in[i] = view_of(nullptr, in[i]->dtype, in[i]->shape);
  for (size_t i = 0; i < out.size(); ++i) a.out[i] = view_of(nullptr, out[i]->dtype, out[i]->shape);
  a.attrs = attrs;
  a.ctx = &ctx;
  // Asked with null data pointers, as the planner asks. The reference must
  // take everything the op accepts: it is what every other kernel is judged by.
  if (k.supports && !k.supports(a))
    throw CaseError(
        fmt::format("the reference kernel of '{}' does not support these operands", k.op));
  const size_t ws = k.workspace ? k.workspace(a) : 0;
  // Junk, not zeros: a kernel may not assume a cleared workspace.
  std::vector<std::byte> wsbuf(ws, std::byte{0xFF});
  for (size_t i = 0; i < in.size(); ++i) a.in[i].data = in[i]->bytes.data();
  for (size_t i = 0; i < out.size(); ++i) a.out[i].data = out[i]->bytes.data();
  a.workspace = ws ? wsbuf.data() : nullptr;
  a.workspace_bytes = ws;
  k.fn(a);
}

// ---------------------------------------------------------------------------
// Reporting

// The check running now, for the crash handler: a kernel that faults kills
// the process, and the last thing printed should say which one it was.
char g_current[512] = "(set-up)";

void set_current(const std::string& s) {
  const size_t n = std::min(s.size(), sizeof(g_current) - 1);
  std::memcpy(g_current, s.data(), n);
  g_current[n] = '\0';
}

extern "C" void on_fatal_signal(int sig) {
  // Only async-signal-safe calls here.
  const char a[] = "\npooch-opcheck: crashed (signal ";
  char digits[4] = {static_cast<char>('0' + sig / 10 % 10), static_cast<char>('0' + sig % 10), ')',
                    ' '};
  const char b[] = "during: ";
  ssize_t r = write(2, a, sizeof(a) - 1);
  r = write(2, digits, 4);
  r = write(2, b, sizeof(b) - 1);
  r = write(2, g_current, std::strlen(g_current));
  r = write(2, "\n", 1);
  (void)r;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct Report {
  bool verbose = false;
  int passed = 0, failed = 0, skipped = 0;

  void pass(const std::string& what, const std::string& detail) {
    ++passed;
    if (verbose && !detail.empty())
      std::printf("PASS  %s  (%s)\n", what.c_str(), detail.c_str());
    else
      std::printf("PASS  %s\n", what.c_str());
  }
  void fail(const std::string& what, const std::string& detail) {
    ++failed;
    std::printf("FAIL  %s: %s\n", what.c_str(), detail.c_str());
  }
  void unsupported(const std::string& what) {
    ++skipped;
    std::printf("SKIP  %s: not supported\n", what.c_str());
  }
  void note(const std::string& what) { std::printf("note: %s\n", what.c_str()); }
};

// ---------------------------------------------------------------------------
// Backends

struct BackendFactory {
  const char* name;
  // Throws Error(POOCH_ERR_NO_DEVICE) when this machine lacks the device.
  std::unique_ptr<Backend> (*make)(const Options&);
};

// Every backend the checker knows. A new backend is one line here.
const BackendFactory kFactories[] = {
    {"cpu",
     [](const Options& o) {
       return make_cpu_backend(CpuBackendParams{0, o.threads});
     }},
#ifdef POOCH_HAVE_CUDA
    // Throws POOCH_ERR_NO_DEVICE without a GPU: skipped (exit 77) or left out.
    {"cuda",
     [](const Options& o) {
       CudaBackendParams p;
       p.threads = o.threads;
       return make_cuda_backend(p);
     }},
#endif
};

struct Slot {
  std::string name;
  std::unique_ptr<Backend> be;
  BackendCaps caps;
  size_t capacity = 0;  // bytes of the arena, and of the host pool that stages it
  std::byte* arena = nullptr;
  std::byte* host = nullptr;
  std::vector<const KernelVariant*> kernels_for(std::string_view op) const {
    std::vector<const KernelVariant*> out;
    for (const KernelVariant& k : be->kernels())
      if (op == k.op) out.push_back(&k);
    return out;
  }
  void reserve(size_t bytes) {
    if (arena) return;
    be->arena_reserve(bytes);
    be->host_pool_reserve(bytes);
    arena = be->arena_base();
    host = be->host_pool_base();
    capacity = bytes;
  }
};

// ---------------------------------------------------------------------------
// One op invocation and its reference result

struct Instance {
  const OpDef* def = nullptr;
  std::string op;
  Attrs graph_attrs;  // for OpDef::flops
  kern::KernelAttrs attrs;
  std::vector<Buf> in;  // in the dtypes the kernels get
  std::vector<std::string> in_names, out_names;
  std::vector<TensorDesc> in_desc, out_desc;
  double rtol = 0, atol = 0;
  std::string subject;  // how the report names it, e.g. "linear [B=3 I=5 O=7]"
};

Instance make_instance(const OpDef& def, const Attrs& attrs, std::vector<Buf> in,
                       std::vector<std::string> in_names, std::vector<std::string> out_names,
                       double rtol, double atol, std::string subject) {
  Instance x;
  x.def = &def;
  x.op = def.name;
  x.attrs = kernel_attrs(def.name, attrs);
  x.graph_attrs = attrs;
  x.rtol = rtol;
  x.atol = atol;
  x.subject = std::move(subject);
  const int n = static_cast<int>(in.size());
  if (n < def.min_inputs || n > def.max_inputs || n > kern::kMaxOperands)
    throw CaseError(fmt::format("op '{}' takes {} to {} inputs, the case gives {}", def.name,
                                def.min_inputs, def.max_inputs, n));
  for (int i = 0; i < n; ++i)
    x.in_desc.push_back(TensorDesc{in_names[static_cast<size_t>(i)],
                                   in[static_cast<size_t>(i)].dtype,
                                   in[static_cast<size_t>(i)].shape, Role::input});
  std::vector<const TensorDesc*> ptrs;
  for (const TensorDesc& d : x.in_desc) ptrs.push_back(&d);
  const std::vector<OutSpec> specs = def.infer(ptrs, attrs);
  if (specs.size() > kern::kMaxOperands)
    throw CaseError(fmt::format("op '{}' infers {} outputs", def.name, specs.size()));
  for (size_t i = 0; i < specs.size(); ++i) {
    std::string name = i < out_names.size() ? out_names[i] : fmt::format("out{}", i);
    x.out_desc.push_back(TensorDesc{name, specs[i].dtype, specs[i].shape, Role::activation});
    x.out_names.push_back(std::move(name));
  }
  for (int m : def.mutates)
    if (m < 0 || m >= n)
      throw CaseError(
          fmt::format("op '{}' mutates input {}, but the case has {} inputs", def.name, m, n));
  x.in = std::move(in);
  x.in_names = std::move(in_names);
  return x;
}

// What the op must leave behind: its outputs, then its mutated inputs.
struct Expected {
  struct Item {
    std::string name;
    int out = -1;  // output index, or
    int in = -1;   // mutated input index
    Buf want;
  };
  std::vector<Item> items;
};

Expected run_reference(const KernelVariant& ref, const Instance& x,
                       const kern::KernelContext& ctx) {
  std::vector<Buf> in = x.in;
  std::vector<Buf> out;
  for (const TensorDesc& d : x.out_desc) out.push_back(poisoned(d.dtype, d.shape));
  std::vector<Buf*> pi, po;
  for (Buf& b : in) pi.push_back(&b);
  for (Buf& b : out) po.push_back(&b);
  run_host(ref, pi, po, x.attrs, ctx);
  Expected e;
  for (size_t i = 0; i < out.size(); ++i)
    e.items.push_back({x.out_names[i], static_cast<int>(i), -1, std::move(out[i])});
  for (int m : x.def->mutates)
    e.items.push_back({x.in_names[static_cast<size_t>(m)] + " (updated)", -1, m,
                       std::move(in[static_cast<size_t>(m)])});
  return e;
}

// ---------------------------------------------------------------------------
// Placing an invocation in an arena, with guard bytes

struct Region {
  size_t off = 0, bytes = 0;
  std::string what;
};

struct Layout {
  std::vector<Region> in, out;
  Region ws;
  size_t total = 0;
  size_t guard = 0;
  int inplace_in = -1;                              // output 0 shares this input's buffer
  std::vector<std::pair<size_t, size_t>> writable;  // [begin, end), sorted
};

// Every buffer gets `guard` bytes before and after it. The trailing guard
// starts right at the buffer's last byte, not at the next aligned offset, so
// a write one element past the end lands in it.
Layout plan_layout(const Instance& x, size_t ws_bytes, size_t align, int inplace_in) {
  Layout L;
  L.guard = align_up(256, align);
  L.inplace_in = inplace_in;
  size_t cur = 0;
  auto place = [&](size_t bytes, std::string what) {
    Region r{align_up(cur, align) + L.guard, bytes, std::move(what)};
    cur = r.off + bytes + L.guard;
    return r;
  };
  for (size_t i = 0; i < x.in.size(); ++i)
    L.in.push_back(place(x.in[i].bytes.size(), fmt::format("input {} '{}'", i, x.in_names[i])));
  for (size_t i = 0; i < x.out_desc.size(); ++i) {
    if (i == 0 && inplace_in >= 0) {
      Region r = L.in[static_cast<size_t>(inplace_in)];
      r.what = fmt::format("output 0 '{}' (in place on input {})", x.out_names[0], inplace_in);
      L.out.push_back(r);
      continue;
    }
    L.out.push_back(place(x.out_desc[i].bytes(), fmt::format("output {} '{}'", i, x.out_names[i])));
  }
  L.ws = place(ws_bytes, "the workspace");
  L.total = align_up(cur, align);
  for (const Region& r : L.out) L.writable.emplace_back(r.off, r.off + r.bytes);
  for (int m : x.def->mutates) {
    const Region& r = L.in[static_cast<size_t>(m)];
    L.writable.emplace_back(r.off, r.off + r.bytes);
  }
  L.writable.emplace_back(L.ws.off, L.ws.off + L.ws.bytes);
  std::sort(L.writable.begin(), L.writable.end());
  return L;
}

std::byte guard_byte(size_t i) {
  return static_cast<std::byte>(((i * 37u) ^ 0xA5u) & 0xFFu);
}

// The bytes staged into the arena: guard pattern everywhere, then the inputs,
// poisoned outputs and a junk workspace on top.
std::vector<std::byte> build_image(const Layout& L, const Instance& x) {
  std::vector<std::byte> img(L.total);
  for (size_t i = 0; i < img.size(); ++i) img[i] = guard_byte(i);
  for (size_t i = 0; i < x.in.size(); ++i)
    if (!x.in[i].bytes.empty())
      std::memcpy(img.data() + L.in[i].off, x.in[i].bytes.data(), x.in[i].bytes.size());
  for (size_t i = 0; i < x.out_desc.size(); ++i) {
    if (i == 0 && L.inplace_in >= 0) continue;  // starts out holding its input
    fill_poison(img.data() + L.out[i].off, x.out_desc[i].dtype, x.out_desc[i].numel());
  }
  std::memset(img.data() + L.ws.off, 0xFF, L.ws.bytes);
  return img;
}

// Names the place of a stray write for the report.
std::string describe_offset(const Layout& L, size_t i) {
  std::vector<const Region*> all;
  for (const Region& r : L.in) all.push_back(&r);
  for (const Region& r : L.out) all.push_back(&r);
  all.push_back(&L.ws);
  for (const Region* r : all)
    if (i >= r->off && i < r->off + r->bytes)
      return fmt::format("byte {} of {}", i - r->off, r->what);
  for (const Region* r : all)
    if (i >= r->off + r->bytes && i < r->off + r->bytes + L.guard)
      return i == r->off + r->bytes
                 ? fmt::format("the byte right after the end of {}", r->what)
                 : fmt::format("{} bytes after the end of {}", i - (r->off + r->bytes), r->what);
  for (const Region* r : all)
    if (i < r->off && r->off - i <= L.guard)
      return fmt::format("{} byte(s) before the start of {}", r->off - i, r->what);
  return fmt::format("arena offset {}", i);
}

// Every byte the kernel may not write must be as it was.
std::string find_stray_writes(const Layout& L, const std::vector<std::byte>& before,
                              const std::vector<std::byte>& after) {
  size_t first = SIZE_MAX, count = 0, w = 0;
  for (size_t i = 0; i < L.total; ++i) {
    while (w < L.writable.size() && L.writable[w].second <= i) ++w;
    if (w < L.writable.size() && i >= L.writable[w].first) {
      i = L.writable[w].second - 1;
      continue;
    }
    if (before[i] != after[i]) {
      if (first == SIZE_MAX) first = i;
      ++count;
    }
  }
  if (first == SIZE_MAX) return {};
  return fmt::format("wrote outside its outputs: {} byte(s) changed, the first at {}", count,
                     describe_offset(L, first));
}

// ---------------------------------------------------------------------------
// Comparing values

struct Compare {
  int64_t bad = 0;
  int64_t worst = -1;
  double worst_score = -1;  // err / tol; +inf for NaN, Inf or integer mismatches
  double got = 0, want = 0, err = 0, tol = 0;
};

Compare compare(const std::byte* got, DType dt, const Buf& want, double rtol, double atol) {
  Compare c;
  const bool is_int = !dtype_is_float(dt);
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = load(got, dt, i), w = want.get(i);
    const double err = std::fabs(g - w);
    const double tol = is_int ? 0.0 : atol + rtol * std::fabs(w);
    bool ok;
    double score;
    if (is_int) {
      ok = g == w;
      score = ok ? 0 : INFINITY;
    } else if (std::isnan(g) || std::isnan(w)) {
      ok = std::isnan(g) && std::isnan(w);
      score = ok ? 0 : INFINITY;
    } else if (std::isinf(g) || std::isinf(w)) {
      ok = g == w;
      score = ok ? 0 : INFINITY;
    } else {
      ok = err <= tol;
      score = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0);
    }
    if (!ok) ++c.bad;
    if (score > c.worst_score) {
      c = Compare{c.bad, i, score, g, w, err, tol};
    }
  }
  return c;
}

// ---------------------------------------------------------------------------
// The checker

struct Checker {
  const Options& opt;
  Report rep;
  kern::KernelContext ctx;
  std::vector<Slot> slots;
  std::vector<std::string> covered;  // ops checked as an instance (forward or derived)

  explicit Checker(const Options& o) : opt(o), ctx(make_context(o)) { rep.verbose = o.verbose; }

  // --- timing (--bench) ---

  template <class F>
  static double median_us(F&& run) {
    using clk = std::chrono::steady_clock;
    for (int i = 0; i < 2; ++i) run();  // warm-up: caches, page faults, thread pool start
    std::vector<double> t;
    const auto start = clk::now();
    while (t.size() < 5 ||
           (t.size() < 1000 && clk::now() - start < std::chrono::milliseconds(200))) {
      const auto a = clk::now();
      run();
      t.push_back(std::chrono::duration<double, std::micro>(clk::now() - a).count());
    }
    std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
    return t[t.size() / 2];
  }

  void print_bench(const Instance& x, const std::string& what, double us) {
    std::vector<const TensorDesc*> in, out;
    for (const TensorDesc& d : x.in_desc) in.push_back(&d);
    for (const TensorDesc& d : x.out_desc) out.push_back(&d);
    std::string flops = "-";
    if (x.def->flops) {
      const double f = x.def->flops(in, out, x.graph_attrs);
      flops = fmt::format("{:.3g} GFLOP/s", f / (us * 1e3));
    }
    const double bytes = op_bytes(*x.def, in, out, x.graph_attrs);
    std::printf("BENCH %s: %.2f us, %s, %.3g GB/s\n", what.c_str(), us, flops.c_str(),
                bytes / (us * 1e3));
  }

  // --- one variant on one backend ---

  // Stages the image, runs the kernel, returns the arena's bytes after it.
  std::vector<std::byte> run_on(Slot& s, const KernelVariant& k, const Instance& x, const Layout& L,
                                const std::vector<std::byte>& image, KernelArgs& a) {
    std::memcpy(s.host, image.data(), L.total);
    s.be->copy_async(Stream::h2d, s.arena, s.host, L.total);
    s.be->stream_sync(Stream::h2d);
    a = KernelArgs{};
    a.n_in = static_cast<int>(x.in.size());
    a.n_out = static_cast<int>(x.out_desc.size());
    for (size_t i = 0; i < x.in.size(); ++i)
      a.in[i] = view_of(s.arena + L.in[i].off, x.in[i].dtype, x.in[i].shape);
    for (size_t i = 0; i < x.out_desc.size(); ++i)
      a.out[i] = view_of(s.arena + L.out[i].off, x.out_desc[i].dtype, x.out_desc[i].shape);
    a.attrs = x.attrs;
    a.workspace = L.ws.bytes ? s.arena + L.ws.off : nullptr;
    a.workspace_bytes = L.ws.bytes;
    a.ctx = &ctx;
    a.device = s.be->kernel_device();
    s.be->launch(Stream::compute, k, a);
    s.be->stream_sync(Stream::compute);
    s.be->copy_async(Stream::d2h, s.host, s.arena, L.total);
    s.be->stream_sync(Stream::d2h);
    return std::vector<std::byte>(s.host, s.host + L.total);
  }

  // The arguments as the planner sees them: shapes, dtypes and attributes,
  // null data pointers, and the backend's device.
  KernelArgs probe_args(const Slot& s, const Instance& x) const {
    KernelArgs probe;
    probe.n_in = static_cast<int>(x.in.size());
    probe.n_out = static_cast<int>(x.out_desc.size());
    for (size_t i = 0; i < x.in.size(); ++i)
      probe.in[i] = view_of(nullptr, x.in[i].dtype, x.in[i].shape);
    for (size_t i = 0; i < x.out_desc.size(); ++i)
      probe.out[i] = view_of(nullptr, x.out_desc[i].dtype, x.out_desc[i].shape);
    probe.attrs = x.attrs;
    probe.ctx = &ctx;
    probe.device = s.be->kernel_device();
    return probe;
  }

  void check_variant(Slot& s, const KernelVariant& k, const Instance& x, const Expected& e,
                     int inplace_in) {
    const std::string what =
        fmt::format("{} {}/{}{}", x.subject, s.name, k.variant, inplace_in >= 0 ? " in-place" : "");
    set_current(what);
    try {
      const KernelArgs probe = probe_args(s, x);
      const size_t ws = k.workspace ? k.workspace(probe) : 0;
      const Layout L = plan_layout(x, ws, s.caps.alignment, inplace_in);
      s.reserve(opt.arena_mib << 20);
      if (L.total > s.capacity) {
        rep.fail(what, fmt::format("needs {} MiB of arena, the checker has {}; run with a larger "
                                   "--arena-mib",
                                   (L.total >> 20) + 1, s.capacity >> 20));
        return;
      }
      const std::vector<std::byte> image = build_image(L, x);
      KernelArgs a;
      const std::vector<std::byte> after = run_on(s, k, x, L, image, a);

      std::vector<std::string> problems;
      std::string detail;
      if (std::string stray = find_stray_writes(L, image, after); !stray.empty())
        problems.push_back(stray);
      double worst_score = -1;
      for (const Expected::Item& it : e.items) {
        const Region& r =
            it.out >= 0 ? L.out[static_cast<size_t>(it.out)] : L.in[static_cast<size_t>(it.in)];
        const Compare c = compare(after.data() + r.off, it.want.dtype, it.want, x.rtol, x.atol);
        if (c.worst < 0) continue;
        const std::string elem = element_name(it.name, it.want.shape, c.worst);
        if (c.bad)
          problems.push_back(fmt::format(
              "{} = {}, want {} (|err| {} > tol {}; {} of {} elements "
              "off)",
              elem, num(c.got), num(c.want), num(c.err), num(c.tol), c.bad, it.want.numel()));
        else if (c.worst_score > worst_score) {
          worst_score = c.worst_score;
          detail =
              fmt::format("worst {}: |err| {} = {:.3g} of tol", elem, num(c.err), c.worst_score);
        }
      }
      // A variant that claims bitwise reproducibility must give the same
      // bytes twice (with two threads on the CPU, or many blocks on a GPU).
      if (k.deterministic && problems.empty()) {
        const std::vector<std::byte> again = run_on(s, k, x, L, image, a);
        for (const auto& [b, end] : L.writable) {
          if (b == L.ws.off && end == L.ws.off + L.ws.bytes) continue;
          if (std::memcmp(after.data() + b, again.data() + b, end - b) != 0) {
            problems.push_back(fmt::format("declared deterministic, but two runs differ in {}",
                                           describe_offset(L, b)));
            break;
          }
        }
      }
      if (!problems.empty()) {
        rep.fail(what, fmt::format("{}", fmt::join(problems, "; ")));
        return;
      }
      rep.pass(what, detail);
      if (opt.bench && inplace_in < 0) {
        const double us = median_us([&] {
          s.be->launch(Stream::compute, k, a);
          s.be->stream_sync(Stream::compute);
        });
        print_bench(x, what, us);
      }
    } catch (const std::exception& ex) {
      rep.fail(what, fmt::format("raised: {}", ex.what()));
    }
  }

  // An op that declares output 0 a view of input 0 for these operands is
  // launched as nothing: its reference output must be input 0's bytes.
  void check_view(const Instance& x, const Expected& e) {
    if (!x.def->view || x.in.empty() || e.items.empty() || e.items[0].out != 0) return;
    std::vector<const TensorDesc*> in;
    for (const TensorDesc& d : x.in_desc) in.push_back(&d);
    if (!x.def->view(in, x.graph_attrs)) return;
    const std::string what = x.subject + " view";
    const Buf& out = e.items[0].want;
    if (out.bytes == x.in[0].bytes)
      rep.pass(what, "output 0 is input 0's bytes");
    else
      rep.fail(what, fmt::format("declared a view of input 0, but output 0 {} {} is not its bytes",
                                 dtype_name(out.dtype), shape_str(out.shape)));
  }

  // The reference, then every variant of every backend.
  void check_instance(const Instance& x) {
    covered.push_back(x.op);
    set_current(x.subject + " ref");
    const KernelVariant* ref = ref_kernel(x.op);
    if (!ref) {
      rep.fail(x.subject, "no reference kernel in kernels/ref (every kernel needs one)");
      return;
    }
    Expected e;
    try {
      e = run_reference(*ref, x, ctx);
    } catch (const std::exception& ex) {
      rep.fail(x.subject + " ref", fmt::format("raised: {}", ex.what()));
      return;
    }
    check_view(x, e);
    if (opt.bench) {
      std::vector<Buf> in = x.in;
      std::vector<Buf> out;
      for (const TensorDesc& d : x.out_desc) out.push_back(poisoned(d.dtype, d.shape));
      std::vector<Buf*> pi, po;
      for (Buf& b : in) pi.push_back(&b);
      for (Buf& b : out) po.push_back(&b);
      print_bench(x, x.subject + " ref (host)",
                  median_us([&] { run_host(*ref, pi, po, x.attrs, ctx); }));
    }
    for (Slot& s : slots) {
      const std::vector<const KernelVariant*> ks = s.kernels_for(x.op);
      if (ks.empty()) {
        rep.unsupported(fmt::format("{} {}", x.subject, s.name));
        continue;
      }
      // Output 0 may share this input's buffer in a planned step, so the
      // kernel must also be right when the two alias.
      int inplace = x.def->inplace_input;
      if (inplace >= static_cast<int>(x.in.size()) || x.out_desc.empty() ||
          (inplace >= 0 &&
           x.in[static_cast<size_t>(inplace)].bytes.size() != x.out_desc[0].bytes()))
        inplace = -1;
      for (const KernelVariant* k : ks) {
        // A variant that says it does not take these operands is never
        // planned for them: not a failure, and not run.
        bool supported = true;
        try {
          supported = !k->supports || k->supports(probe_args(s, x));
        } catch (const std::exception& ex) {
          rep.fail(fmt::format("{} {}/{}", x.subject, s.name, k->variant),
                   fmt::format("supports() raised: {}", ex.what()));
          continue;
        }
        if (!supported) {
          rep.unsupported(fmt::format("{} {}/{}", x.subject, s.name, k->variant));
          continue;
        }
        check_variant(s, *k, x, e, -1);
        if (inplace >= 0) check_variant(s, *k, x, e, inplace);
      }
    }
  }

  // --- the backward pass of one case ---

  struct Backward {
    Graph g;
    size_t fwd = 0;
    std::vector<TensorId> in, out, dy, dx;
    std::vector<char> in_objective;  // per output: its dy is used, so it enters Σ dy·y
    std::vector<Buf> val;            // per tensor, after evaluation (f64 for float tensors)
  };

  void eval_node(Backward& b, const Node& n) {
    const KernelVariant* ref = ref_kernel(n.op);
    if (!ref) throw CaseError(fmt::format("no reference kernel for '{}'", n.op));
    b.val.resize(b.g.num_tensors());
    std::vector<Buf*> pi, po;
    for (TensorId t : n.inputs) pi.push_back(&b.val[static_cast<size_t>(t)]);
    for (TensorId t : n.outputs) {
      const TensorDesc& d = b.g.tensor(t);
      b.val[static_cast<size_t>(t)] = poisoned(compute_dtype(d.dtype), d.shape);
      po.push_back(&b.val[static_cast<size_t>(t)]);
    }
    run_host(*ref, pi, po, kernel_attrs(n.op, n.attrs), ctx);
  }

  Backward build_backward(const OpCase& c, const OpDef& def, Rng& rng) {
    Backward b;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const HostTensor& h = c.inputs[i];
      const std::string name = b.g.unique_name(h.name.empty() ? fmt::format("in{}", i) : h.name);
      const TensorId id = b.g.add_tensor(TensorDesc{name, h.dtype, h.shape, Role::input});
      b.val.resize(b.g.num_tensors());
      b.val[static_cast<size_t>(id)] =
          from_values(h.values, compute_dtype(h.dtype), h.shape, "input '" + name + "'");
      b.in.push_back(id);
    }
    b.out = b.g.add_op(c.op, b.in, c.attrs);
    b.fwd = b.g.nodes().size() - 1;
    const Node fwd = b.g.nodes()[b.fwd];  // a copy: the builder grows the node list
    for (TensorId o : b.out) {
      const TensorDesc d = b.g.tensor(o);
      if (def.is_loss || !dtype_is_float(d.dtype)) {
        b.dy.push_back(kNoTensor);
        continue;
      }
      const TensorId id =
          b.g.add_tensor(TensorDesc{b.g.unique_name("d." + d.name), d.dtype, d.shape, Role::input});
      b.val.resize(b.g.num_tensors());
      b.val[static_cast<size_t>(id)] =
          from_values(randn(rng, d.shape, "dy").values, DType::f64, d.shape, "dy");
      b.dy.push_back(id);
    }
    std::vector<char> needs(c.inputs.size(), 0);
    for (int k : c.grad_inputs) {
      if (k < 0 || k >= static_cast<int>(c.inputs.size()))
        throw CaseError(
            fmt::format("grad_inputs names input {}, the case has {}", k, c.inputs.size()));
      needs[static_cast<size_t>(k)] = 1;
    }
    b.dx.assign(c.inputs.size(), kNoTensor);
    def.backward(b.g, fwd, b.dy, needs, b.dx);

    // An output whose gradient no backward op reads (layernorm's mean and
    // rstd) is not differentiated through, as in autodiff, so it stays out
    // of the objective. A loss op's objective is its scalar output 0 alone;
    // its other outputs are saved for its backward (linear_xent_index's lse).
    b.in_objective.assign(b.out.size(), 0);
    if (def.is_loss) b.in_objective[0] = 1;
    for (size_t o = 0; o < b.out.size(); ++o) {
      if (b.dy[o] == kNoTensor) continue;
      for (size_t n = b.fwd + 1; n < b.g.nodes().size(); ++n)
        for (TensorId t : b.g.nodes()[n].inputs)
          if (t == b.dy[o]) b.in_objective[o] = 1;
      for (TensorId t : b.dx)
        if (t == b.dy[o]) b.in_objective[o] = 1;
    }
    for (const Node& n : b.g.nodes()) eval_node(b, n);
    return b;
  }

  // The forward op's outputs for these inputs, in f64.
  std::vector<Buf> forward(const Backward& b, std::vector<Buf>& in) {
    const Node& n = b.g.nodes()[b.fwd];
    std::vector<Buf> out;
    for (TensorId t : n.outputs) {
      const TensorDesc& d = b.g.tensor(t);
      out.push_back(poisoned(compute_dtype(d.dtype), d.shape));
    }
    std::vector<Buf*> pi, po;
    for (Buf& x : in) pi.push_back(&x);
    for (Buf& x : out) po.push_back(&x);
    run_host(*ref_kernel(n.op), pi, po, kernel_attrs(n.op, n.attrs), ctx);
    return out;
  }

  // objective(+) - objective(-), where the objective is the loss or Σ dy·y
  // over the differentiated outputs. The latter is summed as Σ dy·(y+ - y-):
  // elements the perturbation does not reach then add exact zeros instead of
  // cancelling in a large sum.
  double objective_delta(const Backward& b, const std::vector<Buf>& plus,
                         const std::vector<Buf>& minus) {
    double d = 0;
    for (size_t o = 0; o < plus.size(); ++o) {
      if (!b.in_objective[o]) continue;
      if (b.dy[o] == kNoTensor) {  // the loss itself
        d += plus[o].get(0) - minus[o].get(0);
        continue;
      }
      const Buf& dy = b.val[static_cast<size_t>(b.dy[o])];
      for (int64_t i = 0; i < plus[o].numel(); ++i)
        d += dy.get(i) * (plus[o].get(i) - minus[o].get(i));
    }
    return d;
  }

  // dx[k] as a dense gradient of input k; a row-sparse one is scattered
  // through its rows tensor.
  std::vector<double> dense_gradient(const Backward& b, size_t k) {
    const TensorDesc& xd = b.g.tensor(b.in[k]);
    const TensorDesc& gd = b.g.tensor(b.dx[k]);
    const Buf& gv = b.val[static_cast<size_t>(b.dx[k])];
    std::vector<double> G(static_cast<size_t>(xd.numel()), 0.0);
    if (gd.sparse_rows == kNoTensor) {
      if (gd.shape != xd.shape)
        throw CaseError(fmt::format("the gradient '{}' has shape {}, its input {}", gd.name,
                                    shape_str(gd.shape), shape_str(xd.shape)));
      for (size_t i = 0; i < G.size(); ++i) G[i] = gv.get(static_cast<int64_t>(i));
      return G;
    }
    const Buf& rows = b.val[static_cast<size_t>(gd.sparse_rows)];
    if (xd.shape.size() != 2 || gd.shape.size() != 2 || gd.shape[1] != xd.shape[1])
      throw CaseError(fmt::format("row-sparse gradient '{}' {} does not match its input {}",
                                  gd.name, shape_str(gd.shape), shape_str(xd.shape)));
    const int64_t n = rows.numel() ? static_cast<int64_t>(rows.get(0)) : -1;
    if (n < 0 || n >= rows.numel() || n > gd.shape[0])
      throw CaseError(fmt::format("rows tensor of '{}' says {} rows; it holds {}, the gradient {}",
                                  gd.name, n, rows.numel() - 1, gd.shape[0]));
    const int64_t cols = xd.shape[1];
    for (int64_t r = 0; r < n; ++r) {
      const auto row = static_cast<int64_t>(rows.get(1 + r));
      if (row < 0 || row >= xd.shape[0])
        throw CaseError(
            fmt::format("rows tensor of '{}' lists row {} of {}", gd.name, row, xd.shape[0]));
      for (int64_t j = 0; j < cols; ++j)
        G[static_cast<size_t>(row * cols + j)] += gv.get(r * cols + j);
    }
    return G;
  }

  void check_finite_differences(const OpCase& c, const Backward& b, const std::string& subject,
                                Rng& rng) {
    std::vector<std::string> excluded;
    for (size_t o = 0; o < b.out.size(); ++o)
      if (!b.in_objective[o] && dtype_is_float(b.g.tensor(b.out[o]).dtype))
        excluded.push_back(b.g.tensor(b.out[o]).name);
    if (std::none_of(b.in_objective.begin(), b.in_objective.end(), [](char v) { return v; })) {
      rep.fail(subject + " backward", "the backward ops read none of the output gradients");
      return;
    }
    for (int k : c.grad_inputs) {
      const auto ku = static_cast<size_t>(k);
      const std::string what =
          fmt::format("{} d/d{} (finite differences)", subject, b.g.tensor(b.in[ku]).name);
      set_current(what);
      try {
        if (!dtype_is_float(c.inputs[ku].dtype))
          throw CaseError("grad_inputs names an integer input");
        if (b.dx[ku] == kNoTensor) {
          rep.fail(what, "the backward builder gave no gradient for it");
          continue;
        }
        const std::vector<double> G = dense_gradient(b, ku);
        if (G.empty()) {
          // An empty input has no gradient to check; its backward ops were
          // still checked above, and its kernels must cope with it.
          if (opt.verbose) rep.note(what + ": empty input, nothing to compare");
          continue;
        }
        double gmax = 0;
        for (double v : G) gmax = std::max(gmax, std::fabs(v));
        const double tol = c.fd_tol * std::max(1.0, gmax);

        std::vector<Buf> in;
        for (TensorId t : b.in) in.push_back(b.val[static_cast<size_t>(t)]);
        // All elements of a small tensor; a fixed random sample of a large
        // one, half of it where the backward pass says the gradient is not
        // zero: a large row-sparse gradient is zero almost everywhere, and a
        // uniform sample alone would compare little but zeros.
        std::vector<int64_t> idx(G.size());
        std::iota(idx.begin(), idx.end(), 0);
        constexpr size_t kMaxSamples = 48;
        if (idx.size() > kMaxSamples) {
          std::vector<int64_t> nonzero;
          for (int64_t i : idx)
            if (G[static_cast<size_t>(i)] != 0) nonzero.push_back(i);
          std::shuffle(nonzero.begin(), nonzero.end(), rng);
          nonzero.resize(std::min(nonzero.size(), kMaxSamples / 2));
          std::shuffle(idx.begin(), idx.end(), rng);
          std::vector<int64_t> pick = nonzero;
          for (size_t j = 0; j < idx.size() && pick.size() < kMaxSamples; ++j)
            if (std::find(nonzero.begin(), nonzero.end(), idx[j]) == nonzero.end())
              pick.push_back(idx[j]);
          idx = std::move(pick);
          std::sort(idx.begin(), idx.end());
        }
        Buf& x = in[ku];
        double worst = -1, wfd = 0, wan = 0;
        int64_t wi = -1, checked = 0, bad = 0;
        for (int64_t i : idx) {
          const double x0 = x.get(i);
          if (!std::isfinite(x0)) continue;  // NaN or Inf inputs have no derivative
          const double h = 1e-6 * std::max(1.0, std::fabs(x0));
          const double xp = x0 + h, xm = x0 - h;
          x.set(i, xp);
          const std::vector<Buf> plus = forward(b, in);
          x.set(i, xm);
          const std::vector<Buf> minus = forward(b, in);
          x.set(i, x0);
          const double fd = objective_delta(b, plus, minus) / (xp - xm);
          const double an = G[static_cast<size_t>(i)];
          double err = std::fabs(fd - an);
          if (std::isnan(err)) err = INFINITY;
          ++checked;
          if (!(err <= tol)) ++bad;
          if (err > worst) {
            worst = err;
            wi = i;
            wfd = fd;
            wan = an;
          }
        }
        if (checked == 0) {
          rep.fail(what, "no finite element to check");
          continue;
        }
        const std::string elem =
            element_name("d" + b.g.tensor(b.in[ku]).name, b.g.tensor(b.in[ku]).shape, wi);
        std::string obj = excluded.empty()
                              ? std::string()
                              : fmt::format("; {} not differentiated", fmt::join(excluded, ", "));
        if (bad)
          rep.fail(what,
                   fmt::format("{} = {} (backward), {} (finite differences); |err| {} > tol "
                               "{}; {} of {} elements off{}",
                               elem, num(wan), num(wfd), num(worst), num(tol), bad, checked, obj));
        else
          rep.pass(what, fmt::format("{} elements, worst {}: |err| {:.3g}, tol {:.3g}{}", checked,
                                     elem, worst, tol, obj));
      } catch (const std::exception& ex) {
        rep.fail(what, fmt::format("raised: {}", ex.what()));
      }
    }
  }

  // --- one case ---

  void check_case(const OpCase& c, Rng& rng) {
    ctx.training = c.training ? 1 : 0;
    const std::string subject = fmt::format("{} [{}]", c.op, c.label);
    set_current(subject);
    const OpDef* def = op_registry().find(c.op);
    if (!def) {
      rep.fail(subject, "no op of that name in the registry");
      return;
    }
    const bool whole = opt.op.empty() || opt.op == c.op;
    if (whole) {
      try {
        std::vector<Buf> in;
        std::vector<std::string> names;
        for (size_t i = 0; i < c.inputs.size(); ++i) {
          const HostTensor& h = c.inputs[i];
          names.push_back(h.name.empty() ? fmt::format("in{}", i) : h.name);
          in.push_back(from_values(h.values, h.dtype, h.shape, "input '" + names.back() + "'"));
        }
        check_instance(
            make_instance(*def, c.attrs, std::move(in), names, {}, c.rtol, c.atol, subject));
      } catch (const std::exception& ex) {
        rep.fail(subject, fmt::format("case error: {}", ex.what()));
        return;
      }
    }
    if (!def->backward) {
      if (whole && !c.grad_inputs.empty())
        rep.fail(subject, "grad_inputs given, but the op has no backward builder");
      return;
    }
    if (c.grad_inputs.empty()) return;  // nothing to differentiate (e.g. a NaN parity case)

    Backward b;
    try {
      b = build_backward(c, *def, rng);
    } catch (const std::exception& ex) {
      rep.fail(subject + " backward",
               fmt::format("building or evaluating it raised: {}", ex.what()));
      return;
    }
    // Each backward op is an op in its own right: check it on every backend
    // with the f32 values it sees in this pass.
    for (size_t n = b.fwd + 1; n < b.g.nodes().size(); ++n) {
      const Node& nd = b.g.nodes()[n];
      if (!whole && opt.op != nd.op) continue;
      const std::string sub = fmt::format("{} (from {} {})", nd.op, c.op, c.label);
      set_current(sub);
      try {
        const OpDef& nd_def = op_registry().get(nd.op);
        std::vector<Buf> in;
        std::vector<std::string> in_names, out_names;
        for (TensorId t : nd.inputs) {
          in.push_back(convert(b.val[static_cast<size_t>(t)], b.g.tensor(t).dtype));
          in_names.push_back(b.g.tensor(t).name);
        }
        for (TensorId t : nd.outputs) out_names.push_back(b.g.tensor(t).name);
        check_instance(make_instance(nd_def, nd.attrs, std::move(in), std::move(in_names),
                                     std::move(out_names), c.rtol, c.atol, sub));
      } catch (const std::exception& ex) {
        rep.fail(sub, fmt::format("case error: {}", ex.what()));
      }
    }
    if (whole && c.finite_differences) check_finite_differences(c, b, subject, rng);
  }

  // Kernels registered under a name the registry does not know are never
  // used by the executor: almost always a typo.
  void check_kernel_names() {
    auto known = [](const char* op) { return op_registry().find(op) != nullptr; };
    for (const KernelVariant& k : kern::ref_kernels())
      if (!known(k.op)) rep.fail(fmt::format("kernel ref/{}", k.op), "no op of that name");
    for (Slot& s : slots)
      for (const KernelVariant& k : s.be->kernels())
        if (!known(k.op))
          rep.fail(fmt::format("kernel {}/{}/{}", s.name, k.op, k.variant), "no op of that name");
  }

  void list() {
    for (const OpDef* d : op_registry().all()) {
      std::string flags;
      if (d->backward) flags += ", differentiable";
      if (d->is_loss) flags += ", loss";
      if (!d->mutates.empty())
        flags += fmt::format(", mutates inputs {}", fmt::join(d->mutates, ","));
      if (d->inplace_input >= 0) flags += fmt::format(", in place on input {}", d->inplace_input);
      if (d->view) flags += ", may be a view of input 0";
      std::printf("%s (%d-%d inputs%s)\n", d->name.c_str(), d->min_inputs, d->max_inputs,
                  flags.c_str());
      std::printf("  ref: %s\n", ref_kernel(d->name) ? "yes" : "MISSING");
      for (Slot& s : slots) {
        std::vector<std::string> v;
        for (const KernelVariant* k : s.kernels_for(d->name))
          v.push_back(
              fmt::format("{}{}", k->variant, k->deterministic ? "" : " (nondeterministic)"));
        std::printf("  %s: %s\n", s.name.c_str(),
                    v.empty() ? "not supported" : fmt::format("{}", fmt::join(v, ", ")).c_str());
      }
    }
  }
};

Rng family_rng(uint64_t seed, uint32_t a, uint32_t b = 0) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), a, b};
  return Rng(seq);
}

}  // namespace

int run_opcheck(const Options& opt) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash must not swallow the lines before it
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_fatal_signal);

  Checker ch(opt);
  if (!opt.op.empty() && !op_registry().find(opt.op)) {
    std::fprintf(stderr, "pooch-opcheck: --op %s: no op of that name (see --list)\n",
                 opt.op.c_str());
    return 2;
  }

  // Backends: the one named must exist here (else "skipped"); with "all",
  // those this machine lacks are left out with a note.
  for (const BackendFactory& f : kFactories) {
    if (opt.backend != "all" && opt.backend != f.name) continue;
    try {
      std::unique_ptr<Backend> be = f.make(opt);
      Slot s;
      s.name = f.name;
      s.caps = be->caps();
      s.be = std::move(be);
      ch.slots.push_back(std::move(s));
    } catch (const Error& e) {
      if (e.code() != POOCH_ERR_NO_DEVICE) throw;
      if (opt.backend != "all") {
        std::printf("pooch-opcheck: skipped: no %s device (%s)\n", f.name, e.what());
        return 77;
      }
      ch.rep.note(fmt::format("backend {} left out: {}", f.name, e.what()));
    }
  }
  if (ch.slots.empty() && opt.backend != "all") {
    std::printf("pooch-opcheck: skipped: no %s device (this build has no %s backend)\n",
                opt.backend == "cuda" ? "CUDA" : opt.backend.c_str(), opt.backend.c_str());
    return 77;
  }

  if (opt.list) {
    ch.list();
    return 0;
  }

  // Each family draws from its own stream, so a change to one case file
  // leaves the data of the others as it was.
  struct Family {
    const char* name;
    std::vector<OpCase> (*make)(Rng&);
  };
  const Family families[] = {{"dense", dense_cases}, {"sparse", sparse_cases}, {"loss", loss_cases},
                             {"optim", optim_cases}, {"conv", conv_cases},     {"lm", lm_cases}};
  std::vector<std::string> fd_covered;
  for (uint32_t f = 0; f < std::size(families); ++f) {
    Rng rng = family_rng(opt.seed, f);
    std::vector<OpCase> cases;
    try {
      cases = families[f].make(rng);
    } catch (const std::exception& e) {
      ch.rep.fail(fmt::format("{} cases", families[f].name),
                  fmt::format("generating them raised: {}", e.what()));
      continue;
    }
    for (uint32_t i = 0; i < cases.size(); ++i) {
      const OpCase& c = cases[i];
      if (!c.grad_inputs.empty() && c.finite_differences) fd_covered.push_back(c.op);
      Rng case_rng = family_rng(opt.seed, f, i + 1);
      ch.check_case(c, case_rng);
    }
  }

  if (opt.op.empty()) {
    ch.check_kernel_names();
    // Gaps in coverage are not failures of any kernel, but worth seeing.
    auto has = [](const std::vector<std::string>& v, const std::string& s) {
      return std::find(v.begin(), v.end(), s) != v.end();
    };
    std::vector<std::string> no_case, no_fd;
    for (const OpDef* d : op_registry().all()) {
      if (!has(ch.covered, d->name)) no_case.push_back(d->name);
      if (d->backward && !has(fd_covered, d->name)) no_fd.push_back(d->name);
    }
    if (!no_case.empty()) ch.rep.note(fmt::format("no case checks: {}", fmt::join(no_case, ", ")));
    if (!no_fd.empty())
      ch.rep.note(
          fmt::format("differentiable, but no case checks gradients: {}", fmt::join(no_fd, ", ")));
  }

  const Report& r = ch.rep;
  std::printf("opcheck: %d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped);
  if (r.passed + r.failed == 0) {
    // A checker that checked nothing must not look like a green run.
    std::fprintf(stderr, "pooch-opcheck: nothing was checked\n");
    return 1;
  }
  return r.failed ? 1 : 0;
}

}  // namespace pooch::opcheck
