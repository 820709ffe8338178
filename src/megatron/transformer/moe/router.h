#pragma once
// Megatron-Core's TopKRouter: logits = x W^T in fp32 (f64 for f64 models; --moe-router-dtype
// fp32 semantics), W (E,H) replicated, then the routing. Where the layer needs the routing's sizes
// on the host (capacity with token dropping, or an exchange over the expert TP x EP group, whose
// split sizes and gathered routings are host data), the routing is routing.h's on the host: the
// logits come back from the device, one wait per layer, as in Megatron. Otherwise (dropless, one
// rank's experts: the usual one-GPU case) it is ops/moe_routing.h's on the tensors' device: the
// probabilities, the choice and the permutation never leave it, and nothing waits for the device
// until the statistics are read at log time. Under sequence parallelism each TP rank routes its
// sequence shard: W's gradient is summed over TP (ParamSpec::sequence_parallel) and the routing's
// loads and losses over the shards (routing.h; an all-reduce of the ops' sums on the device). The
// load-balancing and z losses enter the backward through the logits' gradient, scaled by
// ForwardContext::aux_loss_grad_scale (Megatron's MoEAuxLossAutoScaler).
//
// Aux-loss-free balancing (--moe-router-enable-expert-bias): the expert bias (E, fp32 in
// Megatron, f64 here; its copy on the device in the router's dtype) shifts only which experts are
// chosen. Each training forward adds its tokens per expert to a counter on the device;
// update_expert_bias(), called once per optimizer step after the counts are read and summed over
// the data-parallel ranks, moves the bias towards balance and clears the counter.
#include <string>
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/moe_routing.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/transformer/forward_context.h"
#include "megatron/transformer/moe/routing.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::moe {

class Router {
 public:
  struct Saved {
    Tensor input;  // (T,H) x in the router's dtype
    // Routing on the device (routes_on_host() false):
    Tensor logits;        // (T,E) router dtype
    Tensor probs;         // (T,E) router dtype: the chosen experts' probabilities, 0 elsewhere
    Tensor topk_experts;  // (T,k) i32
    Tensor sums;          // every shard's sums of ops/moe_routing.h (f64, a few values)
    // Routing on the host:
    std::vector<double> host_logits;  // (T,E)
    Routing routing;
    // Both: (2+E) router dtype [load-balancing loss, z loss, tokens per expert of every shard],
    // on the device or (host routing) the CPU; read at log time (MoEStats).
    Tensor stats;
    double aux_loss_grad_scale = 1.0;
    // The per-token tensors; sums and stats are a few values.
    void count(ActivationMemory& m) const {
      m.add(input);
      m.add(logits);
      m.add(probs);
      m.add(topk_experts);
    }
  };
  // host_sizes: the layer's token exchange needs the routing's sizes on the host (an expert TP x
  // EP group of several ranks).
  Router(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
         const std::string& prefix, bool host_sizes);
  // Whether the routing runs on the host (routing.h): capacity, or the exchange's sizes.
  bool routes_on_host() const { return routes_on_host_; }
  // x (T,H); S: tokens are (S,B) sequence-major (seq_aux_loss reads the sequences). Fills `saved`:
  // routing on the host, or probs/topk_experts on the device.
  void forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;
  // dprobs (T,E) on x's device: gradient of the routing probabilities; accumulates W's gradient
  // and returns dx (T,H) in x's dtype.
  Tensor backward(const Tensor& dprobs, const Saved& saved, DType x_dtype) const;

  const RoutingParams& params() const { return params_; }
  int64_t num_experts() const { return num_experts_; }
  // Tokens per expert of the training forwards since the last update, read from the device (at
  // the step's end); empty without expert bias.
  std::vector<double> tokens_since_update() const;
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
  void route_on_host(const Tensor& logits, Saved& saved) const;
  void route_on_device(const Tensor& logits, Saved& saved) const;
  Parameter* weight_;
  std::shared_ptr<Communicator> sequence_shards_;  // TP under sequence parallelism; null otherwise
  int64_t num_experts_;
  RoutingParams params_;
  bool routes_on_host_;
  double bias_update_rate_;
  std::string expert_bias_name_;
  std::string random_logits_site_;           // --moe-router-force-load-balancing: its random site; empty: off
  std::vector<double> expert_bias_;          // empty unless enabled
  mutable Tensor expert_bias_on_device_;     // its copy in the router's dtype; undefined until used
  mutable Tensor tokens_since_update_;       // (E) router dtype on the device; training forwards add their loads
};

}  // namespace megatron::moe
