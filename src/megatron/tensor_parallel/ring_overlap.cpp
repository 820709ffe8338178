#include "megatron/tensor_parallel/ring_overlap.h"

#include <array>

#include "megatron/ops/elementwise.h"

namespace megatron::tensor_parallel {
namespace {

int ring_index(int i, int tp) { return ((i % tp) + tp) % tp; }

// One ring step: send `out` to the next rank while receiving `in` from the previous one.
CommHandlePtr pass_along(const Tensor& out, Tensor& in, const ParallelContext& ctx) {
  const int tp = ctx.tp_size(), r = ctx.tp_rank();
  const std::array<P2POp, 2> ops = {P2POp{P2POp::Kind::send, out, ring_index(r + 1, tp)},
                                    P2POp{P2POp::Kind::recv, in, ring_index(r - 1, tp)}};
  return ctx.tp->batch_p2p_async(ops);
}

}  // namespace

Tensor all_gather_sequence_overlapped(const Tensor& shard, const ParallelContext& ctx, const ChunkInput& compute) {
  const int tp = ctx.tp_size(), r = ctx.tp_rank();
  const int64_t rows = shard.dim(0);
  Shape full_shape = shard.shape();
  full_shape[0] = rows * tp;
  Tensor full = Tensor::empty(full_shape, shard.dtype(), shard.device());
  auto chunk = [&](int c) { return full.slice(c * rows, (c + 1) * rows); };
  chunk(r).copy_from(shard);
  for (int step = 0; step < tp; ++step) {
    const int have = ring_index(r - step, tp);  // arrived in the previous step (this rank's own at step 0)
    CommHandlePtr transfer;
    if (step + 1 < tp) {
      Tensor next = chunk(ring_index(r - step - 1, tp));
      transfer = pass_along(chunk(have), next, ctx);
    }
    compute(have, chunk(have));
    if (transfer) transfer->wait();
  }
  return full;
}

Tensor reduce_scatter_sequence_overlapped(const Shape& shard_shape, DType dtype, Device device,
                                          const ParallelContext& ctx, const ChunkPartial& compute) {
  const int tp = ctx.tp_size(), r = ctx.tp_rank();
  CommHandlePtr transfer;
  Tensor received;  // the previous rank's running sum of this step's chunk
  Tensor sum;
  for (int step = 0; step < tp; ++step) {
    const int c = ring_index(r - step - 1, tp);  // chunk r itself at the last step
    sum = Tensor::empty(shard_shape, dtype, device);
    compute(c, sum);  // runs while the previous step's transfer is in flight
    if (transfer) {
      transfer->wait();
      ops::add(sum, sum, received);
    }
    if (step + 1 < tp) {
      received = Tensor::empty(shard_shape, dtype, device);
      transfer = pass_along(sum, received, ctx);
    } else {
      transfer.reset();
    }
  }
  return sum;
}

}  // namespace megatron::tensor_parallel
