// Which tensors of a program lie in a blocked layout (kern::Layout).
//
// oneDNN's convolutions run in nChw16c activations and OIhw16i16o weights;
// with plain tensors each call reorders its input, its output, its output
// gradient and its weights (a third of a small ResNet-50 train step on the
// CPU). Where the kernels on both sides of a tensor take the blocked layout,
// it stays blocked from one layer to the next and no reorder runs
// (docs/OPS.md, "Blocked layouts").
#pragma once
#include <span>
#include <vector>

#include "../../kernels/common/kernel_abi.h"
#include "program_facts.h"

namespace pooch {

// What one launch takes: the operands (kern::in_bit, out_bit) its kernel
// takes in each blocked layout, and whether they go together (same_layout).
struct LaunchLayouts {
  uint32_t nchw16c = 0, oihw16i16o = 0;
  bool same = false;
};

// The blocked layouts kernel k (null: none) takes for a launch with
// arguments `a` (plain): its KernelVariant masks, less each operand whose
// blocked layout its `supports` refuses for these shapes.
LaunchLayouts launch_layouts(const kern::KernelVariant* k, const kern::KernelArgs& a);

// The launches of a program's positions, as the layout choice sees them.
struct LayoutLaunches {
  // Per position: what its node's kernel takes; nothing where the node is a
  // view (its operands stay plain).
  std::vector<LaunchLayouts> kernel;
  // Per position: the node a recompute launches instead (OpDef::replay) and
  // what its kernel takes; null where there is none.
  std::vector<const Node*> replay;
  std::vector<LaunchLayouts> replay_kernel;
};

// Per tensor of g (each view's entry is its root's), a blocked layout where
// every launch that reads or writes the tensor takes it for that operand
// (KernelVariant::blocked, blocked_weights), operands of a same_layout kernel
// going together, and plain everywhere else (everywhere when `blocked` is
// false):
// - Layout::nchw16c for a 4-D f32 activation or gradient whose channels are
//   a multiple of 16;
// - Layout::oihw16i16o for a 4-D f32 weight, optimizer state or gradient
//   whose first two dimensions are multiples of 16;
// never for a tensor a view aliases or the program copies out. Weights and
// optimizer states outlive a program: `persistent` (per tensor; empty: choose
// them too) holds the session's layout of each (persistent_layouts), which
// the program keeps; one that cannot (it copies out a tensor of the class
// an update joins to a blocked weight) is refused (POOCH_ERR_UNSUPPORTED).
std::vector<kern::Layout> choose_layouts(const Graph& g, const ProgramRequest& req,
                                         const Aliases& al, const LayoutLaunches& launches,
                                         bool blocked,
                                         std::span<const kern::Layout> persistent = {});

// The session's layout of each weight and optimizer state, from the layouts
// each of its programs chose freely (`chosen[i]` for `programs[i]`): a
// blocked layout where every program that reads or writes the tensor chose
// it, plain elsewhere and for the other tensors.
std::vector<kern::Layout> persistent_layouts(const Graph& g,
                                             std::span<const ProgramRequest* const> programs,
                                             std::span<const std::vector<kern::Layout>> chosen);

}  // namespace pooch
