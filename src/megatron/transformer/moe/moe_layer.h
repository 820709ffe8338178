#pragma once
// Megatron-Core's MoELayer, in place of the MLP of the layers --moe-layer-freq selects:
//   y = sum_e probs[t,e] expert_e(x_t)  (+ shared_expert(x) with --moe-shared-expert-intermediate-size,
//   gated with --moe-shared-expert-gate: shared_experts.h)
// router (router.h) -> dispatch (token_dispatcher.h) -> experts (experts.h) -> combine; under
// expert parallelism and tensor parallelism (with sequence parallelism: each TP rank holds a
// shard of the tokens and routes it) each rank runs its own experts, or its expert TP shard of
// them (--expert-tensor-parallel-size, default TP), on the tokens of the whole expert TP x EP group (ParallelContext::expert_tp_ep), which
// reach it by --moe-token-dispatcher-type: allgather (every rank gathers every token,
// token_dispatcher.h) or alltoall (each token goes to its experts' ranks only,
// alltoall_exchange.h); the exchange back sums the expert TP shards' partial outputs. Parameter
// names are Megatron's: mlp.router.weight, mlp.experts.linear_fc{1,2}.weight (all experts, by global
// index), mlp.shared_experts.linear_fc{1,2}.weight (and .gate_weight).
#include <memory>
#include <string>

#include "megatron/transformer/moe/alltoall_exchange.h"
#include "megatron/transformer/moe/experts.h"
#include "megatron/transformer/moe/moe_stats.h"
#include "megatron/transformer/moe/router.h"
#include "megatron/transformer/moe/shared_experts.h"
#include "megatron/transformer/moe/token_dispatcher.h"

namespace megatron::moe {

class MoELayer {
 public:
  struct Saved {
    Router::Saved router;
    DispatchPlan plan;          // alltoall: this rank's tokens over all experts
    AllToAllExchange exchange;  // alltoall only
    Experts::Saved experts;
    Tensor expert_output;  // (N,H) rows before the weighted combine: the probabilities' gradient
    SharedExperts::Saved shared;
    // --recompute-modules moe: the layer's input and forward settings alone (with the router's
    // statistics); backward runs the forward again from them.
    Tensor recompute_input;
    ForwardContext recompute_fwd;
    void count(ActivationMemory& m) const;
  };
  MoELayer(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
           const std::string& prefix);
  Tensor forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;  // (S,B,H) -> (S,B,H)
  Tensor backward(const Tensor& dy, const Saved& saved) const;
  // Adds this layer's routing of the forward `saved` came from.
  void add_stats(const Saved& saved, MoEStats& stats) const { stats.add(saved.router.stats, router_.params()); }
  Router& router() { return router_; }
  const Router& router() const { return router_; }

 private:
  Tensor forward_kept(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;  // keeps what backward reads
  Tensor backward_kept(const Tensor& dy, const Saved& saved) const;
  bool recompute_;                         // --recompute-modules moe
  std::shared_ptr<Communicator> exchange_;  // expert TP x EP; null when one rank
  bool alltoall_;                          // the all-to-all dispatcher (with an exchange)
  Router router_;
  Experts experts_;
  std::unique_ptr<SharedExperts> shared_experts_;
};

}  // namespace megatron::moe
