#pragma once
// What the MoE layers report per forward for the log: the losses (unweighted, as Megatron logs
// them) and the tokens per expert, summed over layers; and the weighted losses the backward
// differentiates.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "megatron/transformer/moe/routing.h"

namespace megatron::moe {

struct MoEStats {
  int64_t layers = 0;
  double load_balancing_loss = 0.0;  // sums over layers
  double z_loss = 0.0;
  double weighted_losses = 0.0;  // coefficient x loss, summed: what the gradient includes
  int64_t min_tokens_per_expert = std::numeric_limits<int64_t>::max();
  int64_t max_tokens_per_expert = 0;
  bool per_sequence = false;  // seq_aux_loss: Megatron logs it as seq_load_balancing_loss

  void add(const Routing& r, const RoutingParams& p) {
    ++layers;
    per_sequence = p.load_balancing == LoadBalancingType::seq_aux_loss;
    load_balancing_loss += r.load_balancing_loss;
    z_loss += r.z_loss;
    weighted_losses += r.weighted_losses(p);
    for (int64_t n : r.all_tokens_per_expert) {
      min_tokens_per_expert = std::min(min_tokens_per_expert, n);
      max_tokens_per_expert = std::max(max_tokens_per_expert, n);
    }
  }
};

}  // namespace megatron::moe
