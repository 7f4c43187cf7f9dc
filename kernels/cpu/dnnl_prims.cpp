#include "dnnl_prims.h"

#include <omp.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../common/call_key.h"
#include "cpu_kernels.h"

namespace pooch::kern::dnnl_cpu {
namespace {

std::mutex g_mu;
std::unordered_map<std::string, std::unique_ptr<Prepared>, KeyHash, KeyEq>& cache() {
  static auto* c = new std::unordered_map<std::string, std::unique_ptr<Prepared>, KeyHash, KeyEq>();
  return *c;
}

}  // namespace

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

int prim_threads(const KernelArgs& a) {
  return a.device ? static_cast<const CpuDevice*>(a.device)->threads : threads_of(a);
}

Prepared& prepared(const char* op, const KernelArgs& a, const Builder& build) {
  // The thread count is part of the key: a primitive runs with the count
  // OpenMP gave when it was made, whatever is set at launch.
  const int threads = prim_threads(a);
  CallKey k = call_key(op, a);
  k.add("|threads=%d", threads);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = cache().find(k.view());
  if (it != cache().end()) return *it->second;
  // First sight: normally at plan time (the workspace query). A launch that
  // finds nothing (a caller that skipped planning) builds it here instead.
  auto prep = std::make_unique<Prepared>();
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  try {
    build(a, *prep);
  } catch (...) {
    omp_set_num_threads(before);
    throw;
  }
  omp_set_num_threads(before);
  Prepared& ref = *prep;
  cache().emplace(std::string(k.view()), std::move(prep));
  return ref;
}

namespace {

size_t aligned(size_t n) {
  return (n + 63) / 64 * 64;
}

// A reorder between two layouts, its scratchpad user-managed.
dnnl::reorder::primitive_desc reorder_pd(const dnnl::memory::desc& from,
                                         const dnnl::memory::desc& to) {
  const dnnl::engine& e = cpu_engine();
  return dnnl::reorder::primitive_desc(e, from, e, to, user_scratchpad());
}

}  // namespace

void add_prim(Prepared& p, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
              const std::vector<ArgOperand>& arg_operands) {
  const dnnl::engine& e = cpu_engine();
  size_t scratch = pd.scratchpad_desc().get_size();
  // The reordered operands' regions follow the shared scratchpad region,
  // whose size is known only once every reorder is made: offsets are kept
  // relative to the first region's end and shifted at the end.
  std::vector<Bind> regions;
  size_t region_bytes = 0;
  std::vector<Step> before, after;
  Step main{std::move(prim), {}, nullptr};
  for (const ArgOperand& ao : arg_operands) {
    const dnnl::memory::desc md = pd.query_md(dnnl::query::exec_arg_md, ao.arg);
    const dnnl::memory::desc user = ao.user.data.ndims ? ao.user : md;
    dnnl::memory operand(user, e, DNNL_MEMORY_NONE);
    p.binds.push_back({ao.operand, 0, operand});
    if (user == md) {
      main.args.emplace(ao.arg, operand);
      continue;
    }
    dnnl::memory inner(md, e, DNNL_MEMORY_NONE);
    regions.push_back({kScratch, region_bytes, inner});
    region_bytes += aligned(md.get_size());
    main.args.emplace(ao.arg, inner);
    const bool is_input = ao.operand < kOut;
    Step r;
    if (!is_input && user == plain_md(md.dims())) r.copy = BlockedToPlain::make(md);
    if (!r.copy) {
      const auto rpd = is_input ? reorder_pd(user, md) : reorder_pd(md, user);
      scratch = std::max(scratch, rpd.scratchpad_desc().get_size());
      r.prim = dnnl::reorder(rpd);
    }
    r.args.emplace(DNNL_ARG_FROM, is_input ? operand : inner);
    r.args.emplace(DNNL_ARG_TO, is_input ? inner : operand);
    (is_input ? before : after).push_back(std::move(r));
  }
  scratch = aligned(scratch);
  if (scratch) {
    dnnl::memory sp(dnnl::memory::desc({static_cast<dnnl::memory::dim>(scratch)},
                                       dnnl::memory::data_type::u8, dnnl::memory::format_tag::a),
                    e, DNNL_MEMORY_NONE);
    p.binds.push_back({kScratch, 0, sp});
    main.args.emplace(DNNL_ARG_SCRATCHPAD, sp);
    for (auto* steps : {&before, &after})
      for (Step& s : *steps)
        if (!s.copy) s.args.emplace(DNNL_ARG_SCRATCHPAD, sp);
  }
  for (Bind& r : regions) {
    r.offset += scratch;
    p.binds.push_back(r);
  }
  p.scratch_bytes = scratch + region_bytes;
  for (Step& s : before) p.steps.push_back(std::move(s));
  p.steps.push_back(std::move(main));
  for (Step& s : after) p.steps.push_back(std::move(s));
}

void execute(Prepared& p, const KernelArgs& a) {
  // The scratchpad and the reordered operands' regions lie in the workspace:
  // a caller that planned less (or none) would have oneDNN write past it.
  if (p.scratch_bytes > a.workspace_bytes || (p.scratch_bytes && !a.workspace))
    throw std::length_error("a oneDNN kernel needs a workspace of " +
                            std::to_string(p.scratch_bytes) + " bytes; it was given " +
                            std::to_string(a.workspace ? a.workspace_bytes : 0));
  std::lock_guard<std::mutex> lock(p.mu);
  for (Bind& b : p.binds) {
    void* h = b.operand == kScratch ? static_cast<char*>(a.workspace) + b.offset
              : b.operand >= kOut   ? a.out[b.operand - kOut].data
                                    : a.in[b.operand - kIn].data;
    b.mem.set_data_handle(h);
  }
  // oneDNN's OpenMP runtime takes the calling thread's team size: the
  // kernel context's thread count, restored afterwards for the host's code.
  const int before = omp_get_max_threads();
  const int nt = prim_threads(a);
  omp_set_num_threads(nt);
  // A CPU stream holds no state between calls; one per thread avoids
  // sharing one between two sessions' workers.
  thread_local dnnl::stream stream(cpu_engine());
  for (Step& s : p.steps) {
    if (!s.copy) {
      s.prim.execute(stream, s.args);
      continue;
    }
    stream.wait();  // the primitive that wrote its input has finished
    s.copy->run(static_cast<const float*>(s.args.at(DNNL_ARG_FROM).get_data_handle()),
                static_cast<float*>(s.args.at(DNNL_ARG_TO).get_data_handle()), nt);
  }
  stream.wait();
  omp_set_num_threads(before);
}

dnnl::memory::desc plain_md(const dnnl::memory::dims& dims) {
  dnnl::memory::format_tag tag = dnnl::memory::format_tag::a;
  switch (dims.size()) {
    case 1:
      tag = dnnl::memory::format_tag::a;
      break;
    case 2:
      tag = dnnl::memory::format_tag::ab;
      break;
    case 3:
      tag = dnnl::memory::format_tag::abc;
      break;
    case 4:
      tag = dnnl::memory::format_tag::abcd;
      break;
    default:
      tag = dnnl::memory::format_tag::abcde;
      break;
  }
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag);
}

dnnl::memory::desc md_of(const dnnl::memory::dims& dims, Layout layout) {
  if (layout == Layout::nchw16c && dims.size() == 4)
    return dnnl::memory::desc(dims, dnnl::memory::data_type::f32,
                              dnnl::memory::format_tag::nChw16c);
  if (layout == Layout::oihw16i16o && dims.size() == 4)
    return dnnl::memory::desc(dims, dnnl::memory::data_type::f32,
                              dnnl::memory::format_tag::OIhw16i16o);
  return plain_md(dims);
}

dnnl::memory::desc any_md(const dnnl::memory::dims& dims) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace pooch::kern::dnnl_cpu
