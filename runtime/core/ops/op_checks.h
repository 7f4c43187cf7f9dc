// Operand checks that more than one op family uses: the fixed fan-in layer's
// index and weights (sparse_ops.cpp) and the label-CSR targets of the losses
// (loss_ops.cpp), shared with the fused output layer (ffi_head_ops.cpp).
#pragma once
#include <string_view>

#include "../op_registry.h"

namespace pooch {

// index[L,K] is u16 or i32 (u16 only when `hidden` <= 65536), L*K < 2^31.
void check_index(std::string_view op, const TensorDesc& index, int64_t hidden);
// t (a weight laid out like the index) has the index's shape and dtype dt.
void expect_like_index(std::string_view op, const TensorDesc& t, const char* role,
                       const TensorDesc& index, DType dt);
// in[0] logits x[B,L] float, in[1] lptr i32[B+1], in[2] lidx i32[M].
void check_logits_label_csr(std::string_view op, InDescs in);

}  // namespace pooch
