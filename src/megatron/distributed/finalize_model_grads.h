#pragma once
// Megatron's finalize_model_grads: what happens to the main grads between the last
// micro-batch's backward and the optimizer step.
//   1. DDP finishes the gradient reduction over DP x CP (finish_grad_sync);
//   2. sequence parallelism: a parameter replicated across TP whose gradient came from this
//      rank's sequence shard only (norm weights and biases, row-parallel biases, the position
//      embedding: ParamSpec::sequence_parallel) has its main grad summed over TP, so every TP
//      rank holds the full gradient (Megatron's _allreduce_layernorm_grads). Without SP those
//      gradients are already identical across TP: each rank saw the whole sequence;
//   3. the word embedding tied across pipeline stages (ParamSpec::shared_embedding) has its main
//      grad summed over the embedding group (the first and last stage), so both copies take the
//      same update (Megatron's _allreduce_word_embedding_grads). With the distributed optimizer
//      the sum runs after the reduce-scatter: the embedding's own bucket puts the same elements
//      in each DP rank's shard on both stages, and the rest of the buffer, stale, is never read.
// With the distributed optimizer only this rank's shards of the buffer are meaningful after
// step 1; the TP ranks of one DP rank own the same shards (the same layout), so summing whole
// parameters over TP keeps them right. Under Megatron FSDP's sharded gradients only the owned
// ranges exist, and those are what is summed (DistributedDataParallel::sequence_parallel_grads).
#include "megatron/distributed/ddp.h"

namespace megatron {

void finalize_model_grads(DistributedDataParallel& ddp);

}  // namespace megatron
