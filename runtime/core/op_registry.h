// What the runtime knows about each op kind, independent of any backend:
// shape inference, cost, in-place permission and how to differentiate it.
// Kernels live in the backends' tables (kernels/*/), keyed by the same name.
#pragma once
#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph.h"

namespace pooch {

struct OutSpec {
  DType dtype;
  Shape shape;
};

using InDescs = std::span<const TensorDesc* const>;

// Appends the ops that compute input gradients. `fwd` is a copy of the
// forward node; dy[i] is the gradient of output i (kNoTensor if none flows
// back); needs[i] says whether input i wants a gradient. The builder sets
// dx[i] for those inputs (it may leave others as kNoTensor).
using BackwardFn = std::function<void(Graph& g, const Node& fwd, std::span<const TensorId> dy,
                                      const std::vector<char>& needs, std::span<TensorId> dx)>;

struct OpDef {
  std::string name;
  int min_inputs = 0;
  int max_inputs = 0;
  // Output dtypes and shapes; throws Error(POOCH_ERR_INVALID_ARG) naming the op.
  std::function<std::vector<OutSpec>(InDescs in, const Attrs& attrs)> infer;
  // Floating point operations of one call (for the profiler and benchmarks).
  std::function<double(InDescs in, InDescs out, const Attrs& attrs)> flops;
  // Bytes one call reads and writes, where that is less than all of its
  // operands (op_bytes): an op that reads only the rows its indices name
  // moves at most as many rows as the indices have slots, however large the
  // table (a 16 GB input layer read by a batch of 262 144 nonzeros). Empty:
  // every operand once, a mutated one twice (op_bytes(def, ...)). The
  // estimated profile (--machine, and a host kernel's time) prices a node
  // by it.
  std::function<double(InDescs in, InDescs out, const Attrs& attrs)> bytes;
  // Output 0 may take this input's buffer when that input dies at this op.
  int inplace_input = -1;
  // Whether output 0 is exactly input 0's bytes in the same order for these
  // operands (a reshape, a transpose that moves only size-1 dimensions): the
  // planner then aliases the two buffers and launches nothing. Empty: never.
  // When it returns false the op's kernel (a copy) runs.
  std::function<bool(InDescs in, const Attrs& attrs)> view;
  // Inputs the op writes into (optimizer updates): these must stay live and
  // are never shared with anything else.
  std::vector<int> mutates;
  // Scheduled as soon as its inputs are made, like the optimizer updates (the
  // gradient norm's links, so each gradient is read while it is fresh).
  bool early = false;
  // Reads only the rows of its weight (input `row_weight`) that its other
  // inputs name: where that weight's update runs on the host, so does this
  // op (bringing a batch's rows to the device would cost more than its
  // output). -1: not such an op.
  int row_weight = -1;
  // Runs on the host when its output 0 is read only there (a sparse input
  // layer's row gradient, when the weight's update runs on the host): the
  // gradient is made where it is used instead of copied out.
  bool host_for_host_readers = false;
  // How a recompute remakes output 0 where the op itself may not run again
  // (it has several outputs, or writes into its inputs): `op` reads this
  // op's inputs listed in `inputs`, takes its attributes, and makes output
  // 0's exact bits without side effects (batch normalisation's training
  // normalisation: the statistics recomputed from x, the running averages
  // untouched). Recompute only happens in training programs. Empty `op`:
  // none, and such an op's outputs are swapped or kept, never recomputed.
  struct Replay {
    std::string op;
    std::vector<int> inputs;
  } replay;
  BackwardFn backward;  // empty: not differentiable
  // A loss: its output is a scalar, it is only ever the root of the backward
  // pass, and its backward builder ignores dy (the gradient of the loss is 1).
  bool is_loss = false;
};

// Bytes read and written by one call, from the operand sizes.
double op_bytes(InDescs in, InDescs out);
// What one call of op `def` moves: OpDef::bytes where it says, else every
// operand once and the inputs it writes into (OpDef::mutates) twice.
double op_bytes(const OpDef& def, InDescs in, InDescs out, const Attrs& attrs);

// A node's operands, as OpDef's functions take them.
struct NodeOperands {
  std::vector<const TensorDesc*> in, out;
};
NodeOperands node_operands(const Graph& g, const Node& n);
// Floating point operations (0 where the op does not say) and bytes moved by
// one call of node n.
double node_flops(const Graph& g, const Node& n);
double node_bytes(const Graph& g, const Node& n);

class OpRegistry {
 public:
  void add(OpDef def);  // name must be new
  const OpDef* find(std::string_view name) const;
  const OpDef& get(std::string_view name) const;  // throws Error naming the op
  std::vector<const OpDef*> all() const;

 private:
  std::vector<OpDef> defs_;
};

// The process-wide registry, filled on first use by the register_* functions.
const OpRegistry& op_registry();

// One per op family (runtime/core/ops/*.cpp).
void register_dense_ops(OpRegistry& r);      // linear, relu, gelu, dropout, layernorm, add;
                                             // reshape, transpose
void register_sparse_ops(OpRegistry& r);     // sparse_linear, ffi_linear, topk
void register_ffi_head_ops(OpRegistry& r);   // ffi_loss(+_grad), ffi_topk (fused output layer)
void register_loss_ops(OpRegistry& r);       // squared_hinge, bce_logits, softmax_xent (+ _csr)
void register_optimizer_ops(OpRegistry& r);  // sgd/adam updates, dense and row-sparse
void register_conv_ops(OpRegistry& r);       // conv2d, batchnorm, max/avg/global pooling
void register_lm_ops(OpRegistry& r);  // embedding, gelu_tanh, causal_attention, linear_xent_index

// Small helpers for op definitions.
[[noreturn]] void op_error(std::string_view op, const std::string& what);
void expect_rank(std::string_view op, const TensorDesc& t, int rank, const char* role);
void expect_dtype(std::string_view op, const TensorDesc& t, DType dt, const char* role);
// f32, or f64 (the kernel checker builds the same graphs in double).
void expect_float(std::string_view op, const TensorDesc& t, const char* role);
// `t` has the dtype and shape of `ref`.
void expect_like(std::string_view op, const TensorDesc& t, const char* role, const TensorDesc& ref,
                 const char* ref_role);
// Dimension `dim` of `t` equals dimension `ref_dim` of `ref` (a shared size
// such as the batch or the feature width).
void expect_dim(std::string_view op, const TensorDesc& t, int dim, const char* role,
                const TensorDesc& ref, int ref_dim, const char* ref_role);
inline double numel(const TensorDesc* t) {
  return static_cast<double>(t->numel());
}
// The bytes of at most `rows` rows of table t (rank 2): what an op that
// reads only the rows its indices name moves of it (OpDef::bytes).
inline double table_rows_bytes(const TensorDesc* t, int64_t rows) {
  return static_cast<double>(std::min(rows, t->shape[0]) * t->shape[1]) *
         static_cast<double>(dtype_size(t->dtype));
}
// The backward builders name a gradient after the tensor it belongs to.
std::string grad_name(const Graph& g, TensorId t);

}  // namespace pooch
