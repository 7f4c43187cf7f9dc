// The extreme multi-label family: the input (a CSR bag-of-words batch or
// dense rows) -> the spec's layers -> the output layer over the labels -> the
// loss, and top-k over the logits for prediction.
//
// Inputs: batch.ptr i32[B+1], batch.idx i32[max_nnz], batch.val f32[max_nnz]
// (sparse) or batch.x f32[B, width] (dense); the targets as a label CSR,
// batch.lptr i32[B+1] and batch.lidx i32[max_labels]. Outputs: loss,
// top.values f32[B, topk], top.indices i32[B, topk].
#pragma once
#include <memory>

#include "model.h"
#include "model_spec.h"

namespace pooch {

// Validates the spec (Error naming the bad field), resolves its run shape
// (max_nnz, max_labels, topk) and builds the forward graph with its loss.
std::unique_ptr<Model> build_xmc_model(const ModelSpec& spec);

}  // namespace pooch
