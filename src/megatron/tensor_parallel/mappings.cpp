#include "megatron/tensor_parallel/mappings.h"

namespace megatron::tensor_parallel {
namespace {

Shape with_dim0(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

// Rank r's rows land at [r*S_local, (r+1)*S_local): (S,B,H) is row-major, so the sequence
// shards are contiguous and the all-gather of the flat shards is the concatenation along s.
Pending all_gather_sequence(const Tensor& shard, const ParallelContext& ctx) {
  Tensor full = Tensor::empty(with_dim0(shard, shard.dim(0) * ctx.tp_size()), shard.dtype(), shard.device());
  CommHandlePtr handle = ctx.tp->all_gather_async(full, shard);
  return {full, std::move(handle)};
}

Pending reduce_scatter_sequence(const Tensor& full, const ParallelContext& ctx) {
  Tensor shard = Tensor::empty(with_dim0(full, sequence_shard_rows(full, ctx)), full.dtype(), full.device());
  CommHandlePtr handle = ctx.tp->reduce_scatter_async(shard, full, ReduceOp::sum);
  return {shard, std::move(handle)};
}

}  // namespace

int64_t sequence_shard_rows(const Tensor& full, const ParallelContext& ctx) {
  const int tp = ctx.tp_size();
  MEGATRON_CHECK(full.dim(0) % tp == 0, "sequence parallelism: sequence length " << full.dim(0)
                                                                                 << " is not divisible by TP " << tp
                                                                                 << "; use a --seq-length that is");
  return full.dim(0) / tp;
}

Pending gather_from_sequence_parallel_forward_async(const Tensor& shard, const ParallelContext& ctx) {
  return all_gather_sequence(shard, ctx);
}
Pending gather_from_sequence_parallel_backward_async(const Tensor& grad, const ParallelContext& ctx) {
  return reduce_scatter_sequence(grad, ctx);
}

Tensor gather_from_sequence_parallel_forward(const Tensor& shard, const ParallelContext& ctx) {
  return all_gather_sequence(shard, ctx).wait();
}
Tensor gather_from_sequence_parallel_backward(const Tensor& grad, const ParallelContext& ctx) {
  return reduce_scatter_sequence(grad, ctx).wait();
}

Tensor reduce_scatter_to_sequence_parallel_forward(const Tensor& x, const ParallelContext& ctx) {
  return reduce_scatter_sequence(x, ctx).wait();
}
Tensor reduce_scatter_to_sequence_parallel_backward(const Tensor& grad, const ParallelContext& ctx) {
  return all_gather_sequence(grad, ctx).wait();
}

}  // namespace megatron::tensor_parallel
