#pragma once
// Megatron-Core's SharedExpertMLP: a dense MLP every token passes through beside the routed
// experts (--moe-shared-expert-intermediate-size wide), its output scaled per token by
// sigmoid(x . gate_weight) with --moe-shared-expert-gate (Qwen2-MoE's shared_expert_gate). The gate
// weight (1,H), mlp.shared_experts.gate_weight, is replicated over TP; under sequence parallelism
// each rank's gradient of it covers its own tokens and is summed over TP, as a norm's.
#include <string>

#include "megatron/core/activation_memory.h"
#include "megatron/transformer/mlp.h"

namespace megatron::moe {

class SharedExperts {
 public:
  struct Saved {
    MLP::Saved mlp;
    Tensor input, output, score;  // the gate's: the layer's input, the MLP's output, sigmoid per token
    void count(ActivationMemory& m) const;
  };
  SharedExperts(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                const std::string& prefix);
  Tensor forward(const Tensor& x, Saved& saved) const;  // (S,B,H) -> (S,B,H)
  Tensor backward(const Tensor& dy, const Saved& saved) const;

 private:
  MLP mlp_;
  Parameter* gate_weight_ = nullptr;  // null without --moe-shared-expert-gate
};

}  // namespace megatron::moe
