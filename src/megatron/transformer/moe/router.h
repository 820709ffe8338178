#pragma once
// Megatron-Core's TopKRouter: logits = x W^T in fp32 (f64 for f64 models; --moe-router-dtype
// fp32 semantics), W (E,H) replicated, then the routing of routing.h on the host. Under sequence
// parallelism each TP rank routes its sequence shard: W's gradient is summed over TP
// (ParamSpec::sequence_parallel) and the routing's loads and losses over the shards (routing.h). The load-
// balancing and z losses enter the backward through the logits' gradient, scaled by
// ForwardContext::aux_loss_grad_scale (Megatron's MoEAuxLossAutoScaler).
//
// Aux-loss-free balancing (--moe-router-enable-expert-bias): the expert bias (E, fp32 in
// Megatron, f64 here) shifts only which experts are chosen. Each training forward adds its tokens
// per expert to a counter; update_expert_bias(), called once per optimizer step after the counts
// are summed over the data-parallel ranks, moves the bias towards balance and clears the counter.
#include <string>
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/transformer/forward_context.h"
#include "megatron/transformer/moe/routing.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::moe {

class Router {
 public:
  struct Saved {
    Tensor input;                // (T,H) x in the router's dtype
    std::vector<double> logits;  // (T,E)
    Routing routing;
    double aux_loss_grad_scale = 1.0;
    void count(ActivationMemory& m) const { m.add(input); }
  };
  Router(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
         const std::string& prefix);
  // x (T,H); S: tokens are (S,B) sequence-major (seq_aux_loss reads the sequences).
  const Routing& forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;
  // dprobs (T,E): gradient of the routing probabilities; accumulates W's gradient and returns dx
  // (T,H) in x's dtype.
  Tensor backward(const std::vector<double>& dprobs, const Saved& saved, DType x_dtype) const;

  const RoutingParams& params() const { return params_; }
  int64_t num_experts() const { return num_experts_; }
  // Tokens per expert of the training forwards since the last update; empty without expert bias.
  const std::vector<double>& tokens_since_update() const { return tokens_since_update_; }
  // `global_counts`: tokens_since_update() (every sequence shard's tokens) summed over the
  // data-parallel ranks. Clears the counter.
  void update_expert_bias(const std::vector<double>& global_counts);
  const std::vector<double>& expert_bias() const { return expert_bias_; }
  void set_expert_bias(std::vector<double> bias);
  // Megatron's state-dict name of the bias (decoder.layers.N.mlp.router.expert_bias): checkpoints
  // keep it, as every rank holds the same values.
  const std::string& expert_bias_name() const { return expert_bias_name_; }

 private:
  Tensor weight_in_router_dtype() const;
  Parameter* weight_;
  std::shared_ptr<Communicator> sequence_shards_;  // TP under sequence parallelism; null otherwise
  int64_t num_experts_;
  RoutingParams params_;
  double bias_update_rate_;
  std::string expert_bias_name_;
  std::vector<double> expert_bias_;                  // empty unless enabled
  mutable std::vector<double> tokens_since_update_;  // training forwards add their counts
};

}  // namespace megatron::moe
