#include "megatron/distributed/finalize_model_grads.h"

#include <vector>

namespace megatron {

void finalize_model_grads(DistributedDataParallel& ddp) {
  ddp.finish_grad_sync();
  const ParallelContext& ctx = ddp.context();
  if (ctx.tp_size() == 1) return;
  std::vector<Tensor> grads = ddp.sequence_parallel_grads();
  if (!grads.empty()) ctx.tp->all_reduce_coalesced(grads, ReduceOp::sum);
}

}  // namespace megatron
