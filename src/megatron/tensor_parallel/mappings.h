#pragma once
// Megatron's TP communication as conjugate pairs (tensor_parallel/mappings.py). Each region
// is defined once here, forward and backward side by side; parallel layers call only these.
//   copy_to_tp:                    forward identity                | backward all-reduce over TP
//   reduce_from_tp:                forward all-reduce              | backward identity
// Sequence parallelism splits the activations outside the TP regions along the sequence (dim 0
// of (S,B,H)) across the TP ranks; rank r holds rows [r*S/TP, (r+1)*S/TP):
//   gather_from_sequence_parallel: forward all-gather along s      | backward reduce-scatter along s
//   reduce_scatter_to_sequence_parallel:
//                                  forward reduce-scatter along s  | backward all-gather along s
// At TP=1 every one of them is an identity (or a copy).
// The backward of a column-parallel layer overlaps its collectives with its GEMMs (Megatron's
// asynchronous dgrad communication): the *_async forms start the operation and return a
// Pending; its result is usable after wait().
#include <cstdint>

#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"

namespace megatron::tensor_parallel {

inline void copy_to_tp_forward(const Tensor&, const ParallelContext&) {}
inline void copy_to_tp_backward(Tensor& grad, const ParallelContext& ctx) { ctx.tp->all_reduce(grad, ReduceOp::sum); }

struct Pending {
  Tensor result;
  CommHandlePtr handle;
  Tensor wait() {
    handle->wait();
    return result;
  }
};
// grad summed over TP in place, after wait().
inline Pending copy_to_tp_backward_async(Tensor& grad, const ParallelContext& ctx) {
  return {grad, ctx.tp->all_reduce_async(grad, ReduceOp::sum)};
}

inline void reduce_from_tp_forward(Tensor& x, const ParallelContext& ctx) { ctx.tp->all_reduce(x, ReduceOp::sum); }
inline void reduce_from_tp_backward(const Tensor&, const ParallelContext&) {}

// (S/TP, ...) -> (S, ...), and its backward (S, ...) -> (S/TP, ...).
Tensor gather_from_sequence_parallel_forward(const Tensor& shard, const ParallelContext& ctx);
Tensor gather_from_sequence_parallel_backward(const Tensor& grad, const ParallelContext& ctx);
Pending gather_from_sequence_parallel_forward_async(const Tensor& shard, const ParallelContext& ctx);
Pending gather_from_sequence_parallel_backward_async(const Tensor& grad, const ParallelContext& ctx);

// (S, ...) partial sums -> (S/TP, ...) of the sum, and its backward (S/TP, ...) -> (S, ...).
Tensor reduce_scatter_to_sequence_parallel_forward(const Tensor& x, const ParallelContext& ctx);
Tensor reduce_scatter_to_sequence_parallel_backward(const Tensor& grad, const ParallelContext& ctx);

// S / TP, the rows of a rank's sequence shard of the (S, ...) tensor full; an error naming the fix
// when TP does not divide S.
int64_t sequence_shard_rows(const Tensor& full, const ParallelContext& ctx);

// Global index of the first element of this rank's sequence shard `shard` of an (S, ...) tensor:
// where counter-based dropout masks start, so a shard draws the full tensor's mask for its rows.
inline uint64_t sequence_shard_offset(const Tensor& shard, const ParallelContext& ctx) {
  return uint64_t(ctx.tp_rank()) * uint64_t(shard.numel());
}

}  // namespace megatron::tensor_parallel
