#include "dnnl_prims.h"

#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string_view>

#include "../common/call_key.h"

namespace pooch::kern::dnnl_cpu {
namespace {

std::mutex g_mu;
std::unordered_map<std::string, std::unique_ptr<PreparedSet>, KeyHash, KeyEq>& cache() {
  static auto* c =
      new std::unordered_map<std::string, std::unique_ptr<PreparedSet>, KeyHash, KeyEq>();
  return *c;
}

}  // namespace

size_t PreparedSet::scratch_bytes() const {
  size_t m = 0;
  for (const auto& p : items) m = std::max(m, p->scratch_bytes);
  return m;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

PreparedSet& prepared(const char* op, const KernelArgs& a, const Builder& build) {
  const CallKey k = call_key(op, a);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = cache().find(k.view());
  if (it != cache().end()) return *it->second;
  // First sight: normally at plan time (the workspace query). A launch that
  // finds nothing (a caller that skipped planning) builds it here instead.
  auto set = std::make_unique<PreparedSet>();
  build(a, *set);
  PreparedSet& ref = *set;
  cache().emplace(std::string(k.view()), std::move(set));
  return ref;
}

Prepared& add_prim(PreparedSet& set, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
                   std::vector<std::pair<int, int>> arg_operands) {
  auto p = std::make_unique<Prepared>();
  p->prim = std::move(prim);
  const dnnl::engine& e = cpu_engine();
  for (auto [arg, operand] : arg_operands) {
    const dnnl::memory::desc md = pd.query_md(dnnl::query::exec_arg_md, arg);
    dnnl::memory mem(md, e, DNNL_MEMORY_NONE);
    p->binds.push_back({arg, operand, mem});
    p->args.emplace(arg, mem);
  }
  const dnnl::memory::desc sp = pd.scratchpad_desc();
  p->scratch_bytes = sp.get_size();
  if (p->scratch_bytes) {
    dnnl::memory mem(sp, e, DNNL_MEMORY_NONE);
    p->binds.push_back({DNNL_ARG_SCRATCHPAD, kScratch, mem});
    p->args.emplace(DNNL_ARG_SCRATCHPAD, mem);
  }
  set.items.push_back(std::move(p));
  return *set.items.back();
}

void execute(Prepared& p, const KernelArgs& a) {
  std::lock_guard<std::mutex> lock(p.mu);
  for (Bind& b : p.binds) {
    void* h = b.operand == kScratch ? a.workspace
              : b.operand >= kOut   ? a.out[b.operand - kOut].data
                                    : a.in[b.operand - kIn].data;
    b.mem.set_data_handle(h);
  }
  // oneDNN's OpenMP runtime takes the calling thread's team size: the
  // kernel context's thread count, restored afterwards for the host's code.
  const int before = omp_get_max_threads();
  const int nt = a.ctx && a.ctx->threads > 0 ? a.ctx->threads : 1;
  omp_set_num_threads(nt);
  // A CPU stream holds no state between calls; one per thread avoids
  // sharing one between two sessions' workers.
  thread_local dnnl::stream stream(cpu_engine());
  p.prim.execute(stream, p.args);
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

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace pooch::kern::dnnl_cpu
