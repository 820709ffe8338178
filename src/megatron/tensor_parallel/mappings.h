#pragma once
// Megatron's TP communication as conjugate pairs (tensor_parallel/mappings.py). Each region
// is defined once here, forward and backward side by side; parallel layers call only these.
//   copy_to_tp:      forward identity        | backward all-reduce over TP
//   reduce_from_tp:  forward all-reduce      | backward identity
// The sequence-parallel pairs (all-gather <-> reduce-scatter along s) arrive with SP.
#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"

namespace megatron::tensor_parallel {

inline void copy_to_tp_forward(const Tensor&, const ParallelContext&) {}
inline void copy_to_tp_backward(Tensor& grad, const ParallelContext& ctx) { ctx.tp->all_reduce(grad, ReduceOp::sum); }

inline void reduce_from_tp_forward(Tensor& x, const ParallelContext& ctx) { ctx.tp->all_reduce(x, ReduceOp::sum); }
inline void reduce_from_tp_backward(const Tensor&, const ParallelContext&) {}

}  // namespace megatron::tensor_parallel
