#pragma once
// The exchange of Megatron's all-to-all token dispatcher (--moe-token-dispatcher-type alltoall)
// under expert parallelism. Each EP rank permutes only its own tokens into rows grouped by expert
// over all E experts (token_dispatcher.h's plan), so the rows for EP rank r's experts (contiguous
// expert indices) are contiguous, and:
//   to_experts:   local rows (N,H) -> all_to_all_v over EP -> (M,H) in (source rank, local expert)
//                 order -> re-sorted to (local expert, source rank) order: the experts' layout,
//                 each expert's rows by source rank, then token order, as the allgather dispatcher
//   from_experts: the reverse: expert rows (M,H) -> (source rank, local expert) order ->
//                 all_to_all_v back -> (N,H) on the tokens' rank, where combine weights them by
//                 the probabilities (so the probabilities never travel).
// Both are permutations and each is the other's transpose: the backward of to_experts is
// from_experts and the other way round. The split sizes come from the routing's per-expert counts,
// all-gathered over EP once per forward; the all_to_all_v's wait is watched like every collective.
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/parallel/comm.h"

namespace megatron::moe {

struct AllToAllExchange {
  std::vector<int64_t> send_rows;                // (EP) local rows for each rank's experts
  std::vector<int64_t> recv_rows;                // (EP) rows each rank sends this rank's experts
  std::vector<int64_t> tokens_per_local_expert;  // rows of each of this rank's experts
  Tensor expert_order;                           // (M) i32: the received row of each expert-ordered row
  Tensor arrival_order;                          // (M) i32: the expert-ordered row of each received row
  void count(ActivationMemory& m) const {
    m.add(expert_order);
    m.add(arrival_order);
  }
};

// The exchange for this rank's local routing counts (`tokens_per_expert`, E = EP x local experts,
// rank r holding experts [r*L, (r+1)*L)). A collective over `ep`.
AllToAllExchange plan_exchange(const std::vector<int64_t>& tokens_per_expert, int64_t num_local_experts,
                               Communicator& ep, Device device);
// rows (N,H) grouped by expert over all experts -> (M,H) this rank's experts' rows.
Tensor to_experts(const Tensor& rows, const AllToAllExchange& exchange, Communicator& ep);
// expert_rows (M,H) -> (N,H) on the tokens' ranks, in the order to_experts took them.
Tensor from_experts(const Tensor& expert_rows, const AllToAllExchange& exchange, Communicator& ep);

}  // namespace megatron::moe
