#include "megatron/distributed/finalize_model_grads.h"

#include <vector>

namespace megatron {

void finalize_model_grads(DistributedDataParallel& ddp) {
  ddp.finish_grad_sync();
  const ParallelContext& ctx = ddp.context();
  std::vector<Tensor> sequence_parallel = ctx.tp_size() > 1 ? ddp.sequence_parallel_grads() : std::vector<Tensor>{};
  std::vector<Tensor> shared_embedding;
  for (const auto& p : ddp.registry().params())
    if (p->spec.shared_embedding) shared_embedding.push_back(p->main_grad);
  if (!sequence_parallel.empty()) ctx.tp->all_reduce_coalesced(sequence_parallel, ReduceOp::sum);
  if (!shared_embedding.empty()) {
    MEGATRON_CHECK(ctx.embedding != nullptr,
                   "a word embedding shared across pipeline stages on a rank outside the "
                   "embedding group; build the context with tied embeddings");
    ctx.embedding->all_reduce_coalesced(shared_embedding, ReduceOp::sum);
  }
}

}  // namespace megatron
