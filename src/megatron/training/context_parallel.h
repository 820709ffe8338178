#pragma once
// What `megatron train` does for context parallelism (--context-parallel-size C): the rules the
// arguments must keep, and the split of each micro-batch at the data loader's boundary. The model
// side is SelfAttention's (the ring, RoPE at the chunks' true positions); the loop's side is
// small: every CP rank of a DP replica reads the same batch, keeps its two chunks of every
// sequence (Megatron's get_batch_on_this_cp_rank), scales its loss gradient by C (the gradients
// are averaged over DP x CP, and each CP rank's loss is its tokens' share of the sum over the whole
// sequence), and sums the loss over DP x CP as before.
#include <string>
#include <vector>

#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/arguments.h"

namespace megatron {

// Every rule --context-parallel-size C > 1 adds, one message each (value, rule, fix): the sequence
// divisible by 2C (by 2C x TP under sequence parallelism), and the combinations not built yet
// (dropout, sliding windows, pipeline parallelism, MoE).
void check_context_parallel(const TrainingArgs& args, std::vector<std::string>& errors);

// This CP rank's part of a micro-batch: tokens, labels, loss mask, position ids (0..S-1 when not
// given, so the learned position embedding sees the true positions) and segment ids, each (B,S/C)
// holding chunks r and 2C-1-r. The micro-batch itself when the CP group has one rank.
MicroBatch context_parallel_part(const MicroBatch& mb, const Communicator& cp);

}  // namespace megatron
