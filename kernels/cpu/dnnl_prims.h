// oneDNN primitives for the CPU kernels, made when a schedule is planned and
// found again at launch.
//
// The kernel ABI asks a kernel's `workspace` function at plan time with the
// operands' shapes; the oneDNN kernels build their primitives there (with a
// user-managed scratchpad, whose size becomes the arena workspace), and the
// launch only looks them up by the same key and binds the operands' pointers.
// A primitive is built once per process for each distinct call (op, shapes,
// attributes, thread count) and kept for the process's life: a session's
// shapes are fixed, so the cache grows with the number of distinct layers,
// not with steps.
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
#include "blocked_to_plain.h"

namespace pooch::kern::dnnl_cpu {

inline constexpr int kIn = 0, kOut = 100, kScratch = 200;

// Where a memory object's bytes come from at launch: an operand (kIn + i,
// kOut + i) or the workspace (kScratch) at `offset`.
struct Bind {
  int operand;
  size_t offset = 0;
  dnnl::memory mem;
};

// One primitive run with its argument map, or (where `copy` is set) a copy
// from args[DNNL_ARG_FROM], blocked, to args[DNNL_ARG_TO], plain.
struct Step {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  std::shared_ptr<const BlockedToPlain> copy;
};

// One prepared call: its steps (reorders into the layouts the primitive
// chose, the primitive, reorders back to the operands' plain layouts), the
// memory objects whose data handles are set at each launch, and the
// workspace it needs (the largest scratchpad, then one region per reordered
// operand). Two sessions may share an entry; its mutex serialises their
// launches, since the memory objects are shared.
struct Prepared {
  std::vector<Step> steps;
  std::vector<Bind> binds;
  size_t scratch_bytes = 0;
  std::mutex mu;
};

// A primitive argument and the operand it reads or writes. `user` is the
// operand's own (plain) layout; left empty it is taken to be the layout the
// primitive asks for. Where the two differ, the operand is reordered through
// a workspace region.
struct ArgOperand {
  int arg;      // DNNL_ARG_*
  int operand;  // kIn + i or kOut + i
  dnnl::memory::desc user = {};
};

using Builder = std::function<void(const KernelArgs&, Prepared&)>;

const dnnl::engine& cpu_engine();

// The primitives of this call: built by `build` on first sight of its key
// (op name, dtypes, shapes, attributes), found afterwards.
Prepared& prepared(const char* op, const KernelArgs& a, const Builder& build);

// Adds a primitive bound to its operands. An argument whose layout the
// primitive chose (format_tag::any: oneDNN's blocked layouts, where its
// direct convolutions are fast) differs from its operand's `user` layout
// gets a workspace region and a reorder: inputs before the primitive,
// outputs after it. Scratchpads (the primitive's and the reorders') share
// the workspace's first region, since the steps run one after another.
void add_prim(Prepared& p, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
              const std::vector<ArgOperand>& arg_operands);

// Runs one prepared call on this call's operands, with the thread count it
// was prepared for.
void execute(Prepared& p, const KernelArgs& a);

// A plain (row-major) f32 memory descriptor of these dimensions.
dnnl::memory::desc plain_md(const dnnl::memory::dims& dims);

// The f32 descriptor of a 4-D operand in its layout: plain, nChw16c or
// OIhw16i16o (others: plain).
dnnl::memory::desc md_of(const dnnl::memory::dims& dims, Layout layout);

// An f32 descriptor of these dimensions whose layout the primitive chooses.
dnnl::memory::desc any_md(const dnnl::memory::dims& dims);

// Scratchpads are user-managed (their bytes are the arena workspace).
dnnl::primitive_attr user_scratchpad();

}  // namespace pooch::kern::dnnl_cpu
