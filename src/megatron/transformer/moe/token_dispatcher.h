#pragma once
// Where each token goes: the plan that groups the tokens routed to each expert into contiguous
// rows (expert-major, tokens in order within an expert, as Megatron's permute), and the two
// directions of the exchange, built on the ops/moe_permute.h gathers:
//   dispatch: rows = x[row_token]                      combine: y[t] = sum_e probs[t,e] rows'[row of (t,e)]
// Their backwards are the same gathers the other way round. All experts are local in this build
// (expert parallelism will exchange the rows between ranks here).
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/transformer/moe/routing.h"

namespace megatron::moe {

struct DispatchPlan {
  Tensor row_token;   // (N) i32: the token of each row
  Tensor row_prob;    // (N): the probability that row's output is weighted by
  Tensor token_rows;  // (T,E) i32: the row of (t, e), -1 where t does not go to e
  Tensor probs;       // (T,E): the routing probabilities
  std::vector<int64_t> tokens_per_expert;
  void count(ActivationMemory& m) const {
    m.add(row_token);
    m.add(row_prob);
    m.add(token_rows);
    m.add(probs);
  }
};

// `weight_dtype`: of row_prob and probs (the accumulation dtype of the activations).
DispatchPlan plan_dispatch(const Routing& routing, Device device, DType weight_dtype);

// x (T,H) -> rows (N,H)
Tensor dispatch(const Tensor& x, const DispatchPlan& plan);
// rows (N,H) -> y (T,H), weighted by the probabilities
Tensor combine(const Tensor& rows, const DispatchPlan& plan);
// The backward of combine: drows (N,H) and the probabilities' gradient (T,E) on the host.
Tensor combine_backward(const Tensor& dy, const Tensor& rows, const DispatchPlan& plan, std::vector<double>& dprobs);
// The backward of dispatch: dx (T,H), the sum of each token's row gradients.
Tensor dispatch_backward(const Tensor& drows, const DispatchPlan& plan);

}  // namespace megatron::moe
