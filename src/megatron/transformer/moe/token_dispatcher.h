#pragma once
// Where each token goes: the plan that groups the tokens routed to each expert into contiguous
// rows (expert-major, tokens in order within an expert, as Megatron's permute), built from the
// host routing (routing.h) or on the device from the device routing (ops/moe_routing.h: then the
// experts' row counts exist only as device offsets), and the two directions of the exchange,
// built on the ops/moe_permute.h gathers:
//   dispatch: rows = x[row_token]                      combine: y[t] = sum_e probs[t,e] rows'[row of (t,e)]
// Their backwards are the same gathers the other way round.
// Under expert parallelism (Megatron's allgather dispatcher) every EP rank gathers the tokens and
// routings of the whole EP group (rank-major: token r*T + t is rank r's token t), runs its own
// experts on the tokens routed to them, and the partial outputs are summed back to the tokens'
// ranks by a reduce-scatter; backward all-gathers the output gradients and reduce-scatters the
// input gradients and the probabilities' gradients the same way.
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/grouped_gemm.h"
#include "megatron/parallel/comm.h"
#include "megatron/transformer/moe/routing.h"

namespace megatron::moe {

struct DispatchPlan {
  Tensor row_token;   // (N) i32: the token of each row
  Tensor row_prob;    // (N): the probability that row's output is weighted by
  Tensor token_rows;  // (T,E) i32: the row of (t, e), -1 where t does not go to e
  Tensor probs;       // (T,E): the routing probabilities
  ops::ExpertRows expert_rows{std::vector<int64_t>{}};  // the rows of each expert: host counts or device offsets
  void count(ActivationMemory& m) const {
    m.add(row_token);
    m.add(row_prob);
    m.add(token_rows);
    m.add(probs);
  }
};

// Rows for the experts [first_expert, first_expert + num_experts) only: this rank's experts.
// `weight_dtype`: of row_prob and probs (the accumulation dtype of the activations).
DispatchPlan plan_dispatch(const Routing& routing, int64_t first_expert, int64_t num_experts, Device device,
                           DType weight_dtype);
// The plan of a device routing over every expert: probs (T,E) and topk_experts (T,k) of
// Router::Saved, on their device.
DispatchPlan plan_dispatch(const Tensor& probs, const Tensor& topk_experts);

// Expert parallelism: x (T,H) of every rank of `ep`, (EP*T,H); and the routings of every rank as
// one routing of EP*T tokens (the probabilities, the routed map and the counts; no losses).
Tensor gather_tokens(const Tensor& x, Communicator& ep);
Routing gather_routing(const Routing& routing, Communicator& ep, Device device);
// The sum over the EP ranks of their (EP*T, C) partials, this rank's T rows: (T, C).
Tensor sum_to_token_ranks(const Tensor& partial, Communicator& ep);

// x (T,H) -> rows (N,H)
Tensor dispatch(const Tensor& x, const DispatchPlan& plan);
// rows (N,H) -> y (T,H), weighted by the probabilities
Tensor combine(const Tensor& rows, const DispatchPlan& plan);
// The backward of combine: drows (N,H) and the probabilities' gradient dprobs (T,E), in the
// probabilities' dtype on their device.
Tensor combine_backward(const Tensor& dy, const Tensor& rows, const DispatchPlan& plan, Tensor& dprobs);
// The backward of dispatch: dx (T,H), the sum of each token's row gradients.
Tensor dispatch_backward(const Tensor& drows, const DispatchPlan& plan);

}  // namespace megatron::moe
