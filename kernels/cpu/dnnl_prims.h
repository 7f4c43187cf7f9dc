// oneDNN primitives for the CPU kernels, made when a schedule is planned and
// found again at launch.
//
// The kernel ABI asks a kernel's `workspace` function at plan time with the
// operands' shapes; the oneDNN kernels build their primitives there (with a
// user-managed scratchpad, whose size becomes the arena workspace), and the
// launch only looks them up by the same key and binds the operands' pointers.
// A primitive is built once per process for each distinct call (op, shapes,
// attributes) and kept for the process's life: a session's shapes are fixed,
// so the cache grows with the number of distinct layers, not with steps.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/kernel_abi.h"

namespace pooch::kern::dnnl_cpu {

// Where a primitive argument's bytes come from at launch.
struct Bind {
  int arg;      // DNNL_ARG_*
  int operand;  // kIn + i, kOut + i, or kScratch
  dnnl::memory mem;
};
inline constexpr int kIn = 0, kOut = 100, kScratch = 200;

// One prepared call: a primitive, its argument map (memory objects whose
// data handles are set at each launch) and its scratchpad size. Two sessions
// may share an entry; its mutex serialises their launches, since the memory
// objects are shared.
struct Prepared {
  dnnl::primitive prim;
  std::vector<Bind> binds;
  std::unordered_map<int, dnnl::memory> args;
  size_t scratch_bytes = 0;
  std::mutex mu;
};

// A set of primitives one kernel runs (batch normalisation's forward in
// training and in inference, say), keyed by role.
struct PreparedSet {
  std::vector<std::unique_ptr<Prepared>> items;
  size_t scratch_bytes() const;
};

using Builder = std::function<void(const KernelArgs&, PreparedSet&)>;

const dnnl::engine& cpu_engine();

// The primitives of this call: built by `build` on first sight of its key
// (op name, dtypes, shapes, attributes), found afterwards.
PreparedSet& prepared(const char* op, const KernelArgs& a, const Builder& build);

// Adds a primitive with its descriptor's memory for each argument; `scratch`
// from the primitive descriptor's scratchpad.
Prepared& add_prim(PreparedSet& set, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
                   std::vector<std::pair<int, int>> arg_operands);

// Runs one prepared primitive on this call's operands, with the kernel
// context's thread count.
void execute(Prepared& p, const KernelArgs& a);

// A plain (row-major) f32 memory descriptor of these dimensions.
dnnl::memory::desc plain_md(const dnnl::memory::dims& dims);

// Scratchpads are user-managed (their bytes are the arena workspace).
dnnl::primitive_attr user_scratchpad();

}  // namespace pooch::kern::dnnl_cpu
