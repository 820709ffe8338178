#pragma once
// What the MoE layers report per forward for the log: the losses (unweighted, as Megatron logs
// them) and the tokens per expert, summed over layers; and the weighted losses the backward
// differentiates. Each layer's values stay where its router left them (on the device when it
// routed there: Router::Saved::stats) until values() reads them, at log time, so a step does not
// wait for the device once per layer.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/transformer/moe/routing.h"

namespace megatron::moe {

struct MoEStats {
  int64_t layers = 0;
  bool per_sequence = false;  // seq_aux_loss: Megatron logs it as seq_load_balancing_loss
  double aux_loss_coeff = 0.0, z_loss_coeff = 0.0;
  std::vector<Tensor> layer_stats{};  // per layer (2+E): [load-balancing loss, z loss, tokens per expert]

  void add(const Tensor& stats, const RoutingParams& p) {
    ++layers;
    per_sequence = p.load_balancing == LoadBalancingType::seq_aux_loss;
    aux_loss_coeff = p.aux_loss_coeff;
    z_loss_coeff = p.z_loss_coeff;
    layer_stats.push_back(stats);
  }

  struct Values {
    double load_balancing_loss = 0.0;  // sums over layers
    double z_loss = 0.0;
    double weighted_losses = 0.0;  // coefficient x loss, summed: what the gradient includes
    int64_t min_tokens_per_expert = std::numeric_limits<int64_t>::max();
    int64_t max_tokens_per_expert = 0;
  };
  // Reads the layers' values (waits for the device).
  Values values() const {
    Values v;
    for (const Tensor& stats : layer_stats) {
      const Tensor host = stats.to(Device::cpu());
      v.load_balancing_loss += host.item(0);
      v.z_loss += host.item(1);
      v.weighted_losses += aux_loss_coeff * host.item(0) + z_loss_coeff * host.item(1);
      for (int64_t e = 2; e < host.numel(); ++e) {
        const auto n = int64_t(host.item(e));
        v.min_tokens_per_expert = std::min(v.min_tokens_per_expert, n);
        v.max_tokens_per_expert = std::max(v.max_tokens_per_expert, n);
      }
    }
    return v;
  }
};

}  // namespace megatron::moe
