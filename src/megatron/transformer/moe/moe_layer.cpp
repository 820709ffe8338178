#include "megatron/transformer/moe/moe_layer.h"

#include "megatron/ops/elementwise.h"

namespace megatron::moe {
MoELayer::MoELayer(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                   const std::string& prefix)
    : recompute_(config.recompute.recomputes("moe")),
      exchange_(ctx.expert_tp_ep && ctx.expert_tp_ep->size() > 1 ? ctx.expert_tp_ep : nullptr),
      alltoall_(exchange_ && config.moe.moe_token_dispatcher_type == TokenDispatcherType::alltoall),
      router_(registry, ctx, config, prefix + ".router", exchange_ != nullptr),
      experts_(registry, config, prefix + ".experts") {
  const int ep = ctx.ep ? ctx.ep->size() : 1, etp = ctx.expert_tp ? ctx.expert_tp->size() : 1;
  MEGATRON_CHECK(registry.ep_size() == ep,
                 "the parameter registry is for EP " << registry.ep_size() << " but the context's EP group has " << ep
                                                     << " ranks");
  // Megatron's rule: MoE under TP needs sequence parallelism (each TP rank routes its own tokens).
  MEGATRON_CHECK(ctx.tp_size() == 1 || ctx.sequence_parallel(),
                 "MoE layers at --tensor-model-parallel-size " << ctx.tp_size()
                                                               << " need --sequence-parallel (Megatron's rule)");
  MEGATRON_CHECK(registry.expert_tp_size() == etp, "the parameter registry splits experts over expert TP "
                                                       << registry.expert_tp_size() << " but the context's expert TP "
                                                       << "group has " << etp << " ranks");
  MEGATRON_CHECK((exchange_ ? exchange_->size() : 1) == ep * etp,
                 "the context's expert TP x EP group has " << (exchange_ ? exchange_->size() : 1) << " ranks, not EP "
                                                           << ep << " x expert TP " << etp);
  if (config.moe.moe_shared_expert_intermediate_size > 0)
    shared_experts_ = std::make_unique<SharedExperts>(registry, ctx, config, prefix + ".shared_experts");
}

void MoELayer::Saved::count(ActivationMemory& m) const {
  router.count(m);
  plan.count(m);
  exchange.count(m);
  experts.count(m);
  m.add(expert_output);
  shared.count(m);
  m.add(recompute_input);
}

Tensor MoELayer::forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const {
  const Tensor y = forward_kept(x, fwd, saved);
  if (recompute_ && fwd.training) {
    Tensor stats = saved.router.stats;
    saved = {};
    saved.router.stats = stats;
    saved.recompute_input = x;
    saved.recompute_fwd = fwd;
    saved.recompute_fwd.recompute = true;  // counts no expert-bias loads again
  }
  return y;
}

Tensor MoELayer::backward(const Tensor& dy, const Saved& saved) const {
  if (!saved.recompute_input.defined()) return backward_kept(dy, saved);
  Saved again;
  forward_kept(saved.recompute_input, saved.recompute_fwd, again);
  return backward_kept(dy, again);
}

Tensor MoELayer::forward_kept(const Tensor& x, const ForwardContext& fwd, Saved& saved) const {
  const Tensor tokens = x.view({-1, x.dim(-1)});  // (T,H), T = S*B in sequence-major order
  router_.forward(tokens, fwd, saved.router);
  const Routing& routing = saved.router.routing;  // host routing only
  const DType weights = saved.router.input.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor y;
  if (alltoall_) {
    // This rank's tokens grouped over all experts, exchanged with the experts' ranks and back.
    saved.plan = plan_dispatch(routing, 0, routing.num_experts, x.device(), weights);
    saved.exchange =
        plan_exchange(routing.tokens_per_expert, experts_.num_local_experts(), *exchange_, x.device());
    const Tensor rows = to_experts(dispatch(tokens, saved.plan), saved.exchange, *exchange_);
    const Tensor out = experts_.forward(rows, saved.exchange.tokens_per_local_expert, saved.experts);
    saved.expert_output = from_experts(out, saved.exchange, *exchange_);
    y = combine(saved.expert_output, saved.plan);
  } else {
    // Under EP or expert TP (allgather): the tokens and routings of the whole expert TP x EP
    // group, of which this rank serves its experts (its TP shard of them: partial outputs).
    // Without an exchange and dropless, the router has planned on the device.
    const Tensor all_tokens = exchange_ ? gather_tokens(tokens, *exchange_) : tokens;
    saved.plan = !router_.routes_on_host()
                     ? plan_dispatch(saved.router.probs, saved.router.topk_experts)
                     : plan_dispatch(exchange_ ? gather_routing(routing, *exchange_, x.device()) : routing,
                                     experts_.first_expert(), experts_.num_local_experts(), x.device(), weights);
    saved.expert_output =
        experts_.forward(dispatch(all_tokens, saved.plan), saved.plan.expert_rows, saved.experts);
    const Tensor combined = combine(saved.expert_output, saved.plan);
    y = exchange_ ? sum_to_token_ranks(combined, *exchange_) : combined;
  }
  y = y.view(x.shape());
  if (shared_experts_) {
    const Tensor shared = shared_experts_->forward(x, saved.shared);
    ops::add(y, y, shared);
  }
  return y;
}

Tensor MoELayer::backward_kept(const Tensor& dy, const Saved& saved) const {
  const Tensor dy_tokens = dy.view({-1, dy.dim(-1)});
  Tensor dprobs;
  Tensor dx;
  if (alltoall_) {
    const Tensor drows = combine_backward(dy_tokens, saved.expert_output, saved.plan, dprobs);
    const Tensor dexpert_in = experts_.backward(to_experts(drows, saved.exchange, *exchange_), saved.experts);
    dx = dispatch_backward(from_experts(dexpert_in, saved.exchange, *exchange_), saved.plan);
  } else {
    // The probabilities' gradient on each rank comes from its partial outputs: summed with the
    // input gradient's partials on the tokens' ranks.
    const Tensor dy_all = exchange_ ? gather_tokens(dy_tokens, *exchange_) : dy_tokens;
    const Tensor drows = combine_backward(dy_all, saved.expert_output, saved.plan, dprobs);
    const Tensor dx_all = dispatch_backward(experts_.backward(drows, saved.experts), saved.plan);
    dx = exchange_ ? sum_to_token_ranks(dx_all, *exchange_) : dx_all;
    // In f64, as the host routing reads them.
    if (exchange_) dprobs = sum_to_token_ranks(dprobs.to(DType::f64), *exchange_);
  }
  ops::add(dx, dx, router_.backward(dprobs, saved.router, dx.dtype()));
  dx = dx.view(dy.shape());
  if (shared_experts_) ops::add(dx, dx, shared_experts_->backward(dy, saved.shared));
  return dx;
}

}  // namespace megatron::moe
