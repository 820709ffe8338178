#pragma once
// The exchange of Megatron's all-to-all token dispatcher (--moe-token-dispatcher-type alltoall)
// over the expert TP x EP group (ParallelContext::expert_tp_ep; TP fastest, so group rank g is
// EP rank g / ETP). Each rank permutes only its own tokens into rows grouped by expert over all E
// experts (token_dispatcher.h's plan), so the rows for EP rank r's experts (contiguous expert
// indices) are contiguous, and:
//   to_experts:   local rows (N,H) -> all_to_all_v over the group, each EP rank's rows to every
//                 one of its ETP ranks (each holds a TP shard of those experts) -> (M,H) in
//                 (source rank, local expert) order -> re-sorted to (local expert, source rank)
//                 order: the experts' layout, each expert's rows by source rank, then token
//                 order, as the allgather dispatcher
//   from_experts: the reverse: expert rows (M,H) -> (source rank, local expert) order ->
//                 all_to_all_v back -> the ETP copies of each row summed (the TP partial
//                 outputs) -> (N,H) on the tokens' rank, where combine weights them by the
//                 probabilities (so the probabilities never travel).
// Megatron sends each row once over EP and all-gathers over ETP; sending it to every ETP rank in
// one all-to-all moves the same rows. Each direction is the other's transpose (a permutation,
// and a copy whose transpose is the sum): the backward of to_experts is from_experts and the
// other way round. The split sizes come from the routing's per-expert counts, all-gathered over
// the group once per forward; the all_to_all_v's wait is watched like every collective.
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/parallel/comm.h"

namespace megatron::moe {

struct AllToAllExchange {
  std::vector<int64_t> send_rows;                // (group) local rows for each rank's experts
  std::vector<int64_t> recv_rows;                // (group) rows each rank sends this rank's experts
  std::vector<int64_t> tokens_per_local_expert;  // rows of each of this rank's experts
  Tensor send_order;                             // (sum send_rows) i32: the local row of each sent row (ETP > 1)
  Tensor copies;                                 // (N, ETP) i32: the returned rows of each local row (ETP > 1)
  Tensor expert_order;                           // (M) i32: the received row of each expert-ordered row
  Tensor arrival_order;                          // (M) i32: the expert-ordered row of each received row
  void count(ActivationMemory& m) const {
    m.add(send_order);
    m.add(copies);
    m.add(expert_order);
    m.add(arrival_order);
  }
};

// The exchange for this rank's local routing counts (`tokens_per_expert`, E = EP x local experts,
// EP rank r holding experts [r*L, (r+1)*L)). A collective over `group` (ETP x EP ranks).
AllToAllExchange plan_exchange(const std::vector<int64_t>& tokens_per_expert, int64_t num_local_experts,
                               Communicator& group, Device device);
// rows (N,H) grouped by expert over all experts -> (M,H) this rank's experts' rows.
Tensor to_experts(const Tensor& rows, const AllToAllExchange& exchange, Communicator& group);
// expert_rows (M,H) -> (N,H) on the tokens' ranks, in the order to_experts took them.
Tensor from_experts(const Tensor& expert_rows, const AllToAllExchange& exchange, Communicator& group);

}  // namespace megatron::moe
