// Which activations of a program lie in a blocked layout (kern::Layout).
//
// oneDNN's convolutions run in nChw16c; with plain tensors each call
// reorders its input, its output and its output gradient (a sixth of a
// ResNet-50 train step on the CPU). Where the kernels on both sides of an
// activation take the blocked layout, it stays blocked from one layer to
// the next and no reorder runs (docs/OPS.md, "Layouts of activations").
#pragma once
#include <vector>

#include "../../kernels/common/kernel_abi.h"
#include "program_facts.h"

namespace pooch {

// The launches of a program's positions, as the layout choice sees them.
struct LayoutLaunches {
  // Per position: the kernel of its node; null where the node is a view or
  // runs on the host (its operands stay plain).
  std::vector<const kern::KernelVariant*> kernel;
  // Per position: the node a recompute launches instead (OpDef::replay) and
  // its kernel; null where there is none.
  std::vector<const Node*> replay;
  std::vector<const kern::KernelVariant*> replay_kernel;
};

// Per tensor of g (each view's entry is its root's): Layout::nchw16c for a
// 4-D f32 activation or gradient whose channels are a multiple of 16, that
// no view aliases and the program does not copy out, where every launch
// that reads or writes it takes nchw16c for that operand
// (KernelVariant::blocked); operands of a same_layout kernel go together.
// Plain everywhere else, and everywhere when `blocked` is false.
std::vector<kern::Layout> choose_layouts(const Graph& g, const ProgramRequest& req,
                                         const Aliases& al, const LayoutLaunches& launches,
                                         bool blocked);

}  // namespace pooch
