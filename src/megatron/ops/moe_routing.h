#pragma once
// Top-k routing of mixture of experts on tensors (Megatron-Core's TopKRouter arithmetic and the
// bookkeeping of its permutation), so that a MoE layer's routing stays on the device of its
// tensors: no host copy, no synchronisation per layer. Tokens are rows t of (T,E) logits in the
// (S,B) sequence-major order (t = s*B + b); experts are columns e. Arithmetic in double on every
// backend. The semantics are those of transformer/moe/routing.h's host routing (its reference,
// which the tests compare against) for dropless routing: every chosen expert keeps its token.
// One token's arithmetic is moe_routing_token.h, shared by both backends.
//
//   moe_route:          scores, top-k (group-limited when groups are set), probabilities, and this
//                       shard's sums for the loads and losses (below)
//   moe_route_plan:     tokens per expert and the permutation: the rows of the experts' input,
//                       expert-major with tokens in order within an expert (Megatron's permute,
//                       the host plan's order), and each expert's first row
//   moe_route_losses:   the load-balancing loss, the z loss and the loads, from the sums of every
//                       sequence shard
//   moe_route_backward: the logits' gradient: the probabilities' gradient through the scores,
//                       plus the weighted gradients of the load-balancing and z losses
//
// The sums (f64, routing_sums_size values) of one shard's tokens:
//   [tokens | tokens per expert (E) | f (B,E) | balancing score sums (B,E) | sum of lse^2]
// where f counts the tokens whose top-k of the balancing scores P holds e, per sequence b (B = 1
// for aux_loss: every token one sequence; B = 0 without a load-balancing loss), and lse is the
// logsumexp of a token's logits (0 without a z loss). Under sequence parallelism the caller sums
// them over the shards (an all-reduce) before moe_route_losses and moe_route_backward.
// Every reduction runs in a fixed order, so results are deterministic on every backend.
#include <cstdint>

#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// What the ops compute (transformer/moe/routing.h's RoutingParams without capacity).
struct TopKRouting {
  int64_t topk = 1;
  bool sigmoid = false;      // score function sigmoid, else softmax
  bool pre_softmax = false;  // softmax over all experts before the top-k
  int64_t num_groups = 0, group_topk = 0;  // 0: no group limit
  double scaling_factor = 1.0;
  int64_t balancing_sequences = 0;  // B of the load-balancing counts: 0 none, 1 aux_loss, B seq_aux_loss
  bool z_loss = false;
};

// Limits of one token's work arrays (moe_routing_token.h); the checks name them.
constexpr int64_t kMaxRoutingTopk = 32;
constexpr int64_t kMaxRoutingGroups = 64;

inline int64_t routing_sums_size(int64_t num_experts, const TopKRouting& r) {
  return 2 + num_experts + 2 * r.balancing_sequences * num_experts;
}

// logits (T,E) f32|f64; expert_bias (E) in the logits' dtype, or undefined: added to sigmoid
// scores for the choice only (ignored with softmax, as by the host routing).
// probs (T,E) logits' dtype: the chosen experts' (scaled) probabilities, 0 elsewhere;
// topk_experts (T,k) i32: the chosen experts, the largest routing score first (ties: lower index);
// sums (routing_sums_size) f64: this shard's sums (above). All overwritten.
MEGATRON_OP(moe_route, void(Tensor& probs, Tensor& topk_experts, Tensor& sums, const Tensor& logits,
                            const Tensor& expert_bias, const TopKRouting& routing));
// From topk_experts (T,k) and probs (T,E): row_token (T*k) i32, the token of each row;
// row_prob (T*k) probs' dtype, its probability; token_rows (T,E) i32, the row of (t, e) or -1;
// expert_offsets (E+1) i32, expert e's rows are [offsets[e], offsets[e+1]). All overwritten.
MEGATRON_OP(moe_route_plan, void(Tensor& row_token, Tensor& row_prob, Tensor& token_rows, Tensor& expert_offsets,
                                 const Tensor& topk_experts, const Tensor& probs));
// values (2+E), any floating dtype: [load-balancing loss, z loss, tokens per expert (E)] of the
// tokens of every shard, from sums of every shard. The losses are unweighted; 0 when not computed.
MEGATRON_OP(moe_route_losses, void(Tensor& values, const Tensor& sums, const TopKRouting& routing));
// dlogits (T,E), logits' dtype, overwritten: the gradient of sum(dprobs * probs)
// + aux_loss_weight * load-balancing loss + z_loss_weight * z loss, the choice held fixed. dprobs
// (T,E) in the logits' dtype; sums of every shard.
MEGATRON_OP(moe_route_backward,
            void(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& topk_experts,
                 const Tensor& sums, const TopKRouting& routing, double aux_loss_weight, double z_loss_weight));

}  // namespace megatron::ops
