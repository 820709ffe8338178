#pragma once
// The sequence-parallel all-gather and reduce-scatter (mappings.h) as rings of point-to-point
// steps with a GEMM on each sequence chunk between them, so the transfer of one chunk runs while
// the GEMM of another computes (--tp-comm-overlap; Megatron/TE's ring-exchange overlap). The
// sequence chunks of an (S, ...) tensor are the TP ranks' shards: chunk c is rows
// [c*S/TP, (c+1)*S/TP), contiguous in the sequence-major layout.
//
//   all_gather_sequence_overlapped:     rank r computes on its own shard first while sending it to
//       rank r+1 and receiving chunk r-1 from rank r-1, then on chunk r-1 while passing it on, ...
//       TP-1 transfers of one chunk each, every one beside a chunk's GEMM.
//   reduce_scatter_sequence_overlapped: rank r computes its partial sum of chunk r-1 and sends it
//       to rank r+1; then its partial of chunk r-2 (while that transfer runs), adds what rank r-1
//       sent (rank r-1's running sum of chunk r-2) and sends the sum on; ... the last step leaves
//       chunk r summed over every rank. Sums run in ring order, one rounding per step, as NCCL's
//       ring reduce-scatter.
// On CUDA the transfers run on the TP communicator's stream and the GEMMs on the current stream;
// on CPU ranks (MPI) the same schedule runs, so the CPU tests check its arithmetic.
#include <cstdint>
#include <functional>

#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"

namespace megatron::tensor_parallel {

// compute(c, rows): the work on sequence chunk c, given its rows (S/TP, ...) as they arrive.
using ChunkInput = std::function<void(int chunk, const Tensor& rows)>;
// compute(c, out): writes this rank's partial result for sequence chunk c into out (S/TP, ...).
using ChunkPartial = std::function<void(int chunk, Tensor& out)>;

// shard (S/TP, ...) -> (S, ...), calling compute on every chunk (this rank's first).
Tensor all_gather_sequence_overlapped(const Tensor& shard, const ParallelContext& ctx, const ChunkInput& compute);

// Returns this rank's chunk (shard_shape) of the sum over TP of the partials compute writes.
Tensor reduce_scatter_sequence_overlapped(const Shape& shard_shape, DType dtype, Device device,
                                          const ParallelContext& ctx, const ChunkPartial& compute);

}  // namespace megatron::tensor_parallel
