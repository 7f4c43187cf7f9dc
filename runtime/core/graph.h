// The static graph IR: tensors with roles, ops with numeric attributes.
// Model builders emit the forward part, autodiff appends backward ops and the
// optimizer appends update ops; the executor runs the nodes in order.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../../kernels/common/dtype.h"

namespace pooch {

using TensorId = int32_t;
inline constexpr TensorId kNoTensor = -1;
using Shape = std::vector<int64_t>;
// The largest tensor a graph accepts (also the .pooch format's limit).
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 62;

enum class Role : uint8_t {
  input = 0,
  weight = 1,
  activation = 2,
  gradient = 3,
  optimizer_state = 4
};
inline constexpr int kNumRoles = 5;
const char* role_name(Role r);

struct TensorDesc {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  Role role = Role::activation;
  bool trainable = false;  // a weight that receives a gradient and an update
  // For a row-sparse gradient: the tensor holding [count, row ids...] that says
  // which rows of the weight this [rows_max x cols] tensor holds.
  TensorId sparse_rows = kNoTensor;
  // For a loss computed again by the backward op that differentiates it
  // (ffi_loss_grad also gives ffi_loss's value): that loss. A train step
  // reads this one and skips the forward op (autodiff.h, training_loss).
  TensorId repeats = kNoTensor;

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

std::string shape_str(const Shape& s);

// Numeric op attributes (integers are exact up to 2^53). Ordered so that a
// graph prints and serialises the same way every time.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, double>> kv) : kv_(kv) {}
  bool has(std::string_view k) const { return kv_.find(k) != kv_.end(); }
  double get(std::string_view k, double fallback) const;
  int64_t geti(std::string_view k, int64_t fallback) const {
    return static_cast<int64_t>(get(k, static_cast<double>(fallback)));
  }
  double require(std::string_view op, std::string_view k) const;  // throws naming op and key
  Attrs& set(std::string_view k, double v) {
    kv_[std::string(k)] = v;
    return *this;
  }
  const std::map<std::string, double, std::less<>>& items() const { return kv_; }

 private:
  std::map<std::string, double, std::less<>> kv_;
};

struct Node {
  std::string op;
  Attrs attrs;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
};

class Graph {
 public:
  TensorId add_tensor(TensorDesc desc);  // names must be unique
  // Appends an op; output shapes and dtypes come from the op's shape
  // inference. Returns the new output tensors. Throws Error naming the op when
  // inputs do not fit it.
  std::vector<TensorId> add_op(std::string_view op, std::vector<TensorId> inputs, Attrs attrs = {},
                               std::vector<std::string> out_names = {},
                               Role out_role = Role::activation);
  // Single-output convenience.
  TensorId add_op1(std::string_view op, std::vector<TensorId> inputs, Attrs attrs = {},
                   std::string out_name = {}, Role out_role = Role::activation);

  const TensorDesc& tensor(TensorId id) const { return tensors_.at(static_cast<size_t>(id)); }
  TensorDesc& tensor(TensorId id) { return tensors_.at(static_cast<size_t>(id)); }
  const std::vector<TensorDesc>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  size_t num_tensors() const { return tensors_.size(); }
  std::optional<TensorId> find(std::string_view name) const;

  // Tensors whose values the caller reads after a step (loss, logits...):
  // the arena keeps them alive to the end of the step.
  void mark_output(TensorId id);
  const std::vector<TensorId>& outputs() const { return outputs_; }

  // The graph of the first `tensors` tensors and `nodes` nodes (the forward
  // part of a graph that autodiff and the optimizer extended). Throws Error
  // when a kept node refers to a dropped tensor.
  Graph prefix(size_t tensors, size_t nodes) const;

  // A fresh name with this prefix that no tensor has yet.
  std::string unique_name(std::string_view prefix) const;

 private:
  std::vector<TensorDesc> tensors_;
  std::vector<Node> nodes_;
  std::vector<TensorId> outputs_;
  std::map<std::string, TensorId, std::less<>> by_name_;
};

}  // namespace pooch
