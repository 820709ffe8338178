#pragma once
// The router's arithmetic on one micro-batch's logits, as pure host functions (Megatron-Core's
// moe_utils: topk_routing_with_score_function, apply_router_token_dropping, the load-balancing
// and z losses), so hand-computed cases can test them directly. Tokens are rows t of the (S,B)
// sequence-major order (t = s*B + b); experts are columns e. Computed in f64, which is at least
// Megatron's fp32 router (--moe-router-dtype fp32).
//
// Forward, per token, with l its logits:
//   softmax:             probs over the top-k experts of l: softmax of their logits
//   softmax, pre-softmax: q = softmax(l) over all experts; probs = q at the top-k of q
//   sigmoid:             s = sigmoid(l); top-k of s (+ expert bias when enabled, which only
//                        chooses); probs = s / sum of the chosen s (k > 1), or s (k = 1)
//   then probs *= the top-k scaling factor. Group-limited routing first keeps the group_topk
//   groups with the largest sums of their top (topk / group_topk) scores. Ties go to the lower
//   expert index.
// Capacity (a capacity factor given): each expert keeps ceil(T*k/E * factor) tokens (at most T):
// the largest probs ("probs" policy) or the earliest routed tokens ("position"); with padding the
// kept set is exactly that many tokens, prob 0 where the token did not choose the expert.
// Losses (their gradients are added to the logits' in backward, times aux_loss_grad_scale):
//   aux_loss:      E / (k T^2) * sum_e f_e sum_t P_te, P = softmax(l) (sigmoid: s / sum s),
//                  f_e = tokens whose top-k of P holds e (before capacity; no bias, no groups)
//   seq_aux_loss:  the same per sequence b (T = S), averaged over the B sequences
//   z_loss:        mean_t logsumexp(l_t)^2
// Under sequence parallelism each TP rank routes its own shard of the micro-batch's tokens (the
// same B sequences, other positions): the counts f, the sums over tokens and the loads are summed
// over the shards, so every shard's loss values and loads are the whole micro-batch's (Megatron's
// counts reduced over TP), and each shard's logits get their own tokens' share of the gradient.
// Capacity stays per shard, as Megatron's.
#include <cstdint>
#include <functional>
#include <vector>

#include "megatron/ops/moe_routing.h"
#include "megatron/transformer/moe/moe_config.h"

namespace megatron::moe {

struct RoutingParams {
  int64_t topk = 2;
  RouterScoreFunction score_function = RouterScoreFunction::softmax;
  bool pre_softmax = false;
  int64_t num_groups = 0, group_topk = 0;  // 0: no group limit
  double scaling_factor = 1.0;
  LoadBalancingType load_balancing = LoadBalancingType::aux_loss;
  double aux_loss_coeff = 0.0;
  double z_loss_coeff = 0.0;
  double capacity_factor = 0.0;  // 0: dropless
  TokenDropPolicy drop_policy = TokenDropPolicy::probs;
  bool pad_to_capacity = false;
  int64_t sequence_length = 1;  // S of the (S,B) token order (seq_aux_loss): this shard's positions
};

RoutingParams routing_params(const MoEConfig& moe, int64_t sequence_length);
// The same routing for the device ops (ops/moe_routing.h) of num_tokens tokens; dropless only
// (the ops keep every choice).
ops::TopKRouting topk_routing(const RoutingParams& params, int64_t num_tokens);

struct Routing {
  int64_t num_tokens = 0, num_experts = 0;
  std::vector<double> probs{};               // (T,E) weight of expert e's output for token t; 0 where not kept
  std::vector<uint8_t> chosen{};             // (T,E) the top-k choice, before capacity
  std::vector<uint8_t> routed{};             // (T,E) token t is processed by expert e (after capacity/padding)
  std::vector<int64_t> tokens_per_expert{};  // column sums of routed
  // Over all sequence shards (this shard's alone without sequence parallelism):
  int64_t all_tokens = 0;
  std::vector<int64_t> all_tokens_per_expert{};  // the loads logged and counted for the expert bias
  std::vector<double> balancing_counts{};        // (B,E) f of the load-balancing loss; B = 1 for aux_loss
  double load_balancing_loss = 0.0;              // unweighted; 0 when load balancing is none
  double z_loss = 0.0;                           // unweighted; 0 without a z-loss coefficient
  // The losses as they enter the gradient: coefficient times value.
  double weighted_losses(const RoutingParams& p) const {
    return p.aux_loss_coeff * load_balancing_loss + p.z_loss_coeff * z_loss;
  }
};

// Adds a vector of this shard's sums over the sequence shards in place (an all-reduce over TP).
using SumOverShards = std::function<void(std::vector<double>&)>;

// logits (T,E) row-major; expert_bias (E) or empty; sum_over_shards: empty for one shard.
Routing route(const std::vector<double>& logits, int64_t num_tokens, int64_t num_experts, const RoutingParams& params,
              const std::vector<double>& expert_bias, const SumOverShards& sum_over_shards = {});

// dlogits (T,E): the gradient of sum(dprobs * probs) + aux_loss_grad_scale * weighted_losses
// with the choice and capacity held fixed.
std::vector<double> route_backward(const std::vector<double>& dprobs, const std::vector<double>& logits,
                                   const Routing& routing, const RoutingParams& params, double aux_loss_grad_scale);

// Megatron's aux-loss-free balancing step: bias_e += rate * sign(mean(tokens) - tokens_e).
void update_expert_bias(std::vector<double>& expert_bias, const std::vector<double>& tokens_per_expert,
                        double update_rate);

}  // namespace megatron::moe
