#include "megatron/transformer/moe/router.h"

#include <algorithm>

#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/moe_routing.h"
#include "megatron/ops/random.h"

namespace megatron::moe {
namespace {

DType router_dtype(DType params) { return params == DType::f64 ? DType::f64 : DType::f32; }

Tensor in_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  ops::cast(out, t);
  return out;
}

std::vector<double> to_host_doubles(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<double> v(size_t(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) v[size_t(i)] = host.item(i);
  return v;
}

}  // namespace

Router::Router(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
               const std::string& prefix, bool host_sizes)
    : weight_(registry.add({.name = prefix + ".weight",
                            .global_shape = {config.moe.num_moe_experts, config.hidden_size},
                            .init_std = config.init_method_std,
                            .sequence_parallel = ctx.sequence_parallel()})),
      sequence_shards_(ctx.sequence_parallel() ? ctx.tp : nullptr),
      num_experts_(config.moe.num_moe_experts),
      params_(routing_params(config.moe, config.seq_length / (sequence_shards_ ? ctx.tp_size() : 1))),
      routes_on_host_(host_sizes || params_.capacity_factor > 0.0),
      bias_update_rate_(config.moe.moe_router_bias_update_rate),
      expert_bias_name_(prefix + ".expert_bias") {
  if (config.moe.moe_router_enable_expert_bias) expert_bias_.assign(size_t(num_experts_), 0.0);
  if (config.moe.moe_router_force_load_balancing) random_logits_site_ = prefix + ".random_logits";
}

Tensor Router::weight_in_router_dtype() const { return in_dtype(weight_->data, router_dtype(weight_->data.dtype())); }

void Router::forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const {
  const int64_t T = x.dim(0);
  saved.input = in_dtype(x, router_dtype(x.dtype()));
  Tensor logits = Tensor::empty({T, num_experts_}, saved.input.dtype(), x.device());
  ops::linear_forward(logits, saved.input, weight_in_router_dtype(), Tensor());
  if (!random_logits_site_.empty()) {
    // Megatron's RandomSTE: the routing sees fresh N(0,1) logits and backward hands their gradient
    // to the router's output as it is. Drawn per micro-batch (fwd.step; recomputation draws the
    // same) and per global token under sequence parallelism.
    const uint64_t first_token = sequence_shards_ ? uint64_t(sequence_shards_->rank() * T) : 0;
    ops::fill_normal(logits, {.seed = fwd.seed,
                              .stream = fwd.random_stream(random_logits_site_),
                              .offset = first_token * uint64_t(num_experts_)});
  }
  if (routes_on_host_)
    route_on_host(logits, saved);
  else
    route_on_device(logits, saved);
  saved.aux_loss_grad_scale = fwd.aux_loss_grad_scale;
  if (fwd.training && !fwd.recompute && !expert_bias_.empty()) {
    if (!tokens_since_update_.defined()) tokens_since_update_ = Tensor::zeros({num_experts_}, logits.dtype(), x.device());
    const Tensor loads = saved.stats.slice(2, 2 + num_experts_).to(x.device());
    ops::add(tokens_since_update_, tokens_since_update_, loads);
  }
}

void Router::route_on_host(const Tensor& logits, Saved& saved) const {
  const int64_t T = logits.dim(0), E = num_experts_;
  saved.host_logits = to_host_doubles(logits);
  SumOverShards sum_over_shards;
  if (sequence_shards_)
    sum_over_shards = [&](std::vector<double>& sums) {
      Tensor host = Tensor::empty({int64_t(sums.size())}, DType::f64);
      std::copy(sums.begin(), sums.end(), host.data<double>());
      Tensor on_device = host.to(logits.device());
      sequence_shards_->all_reduce(on_device, ReduceOp::sum);
      sums = to_host_doubles(on_device);
    };
  saved.routing = route(saved.host_logits, T, E, params_, expert_bias_, sum_over_shards);
  const Routing& r = saved.routing;
  saved.stats = Tensor::empty({2 + E}, logits.dtype());
  saved.stats.set_item(0, r.load_balancing_loss);
  saved.stats.set_item(1, r.z_loss);
  for (int64_t e = 0; e < E; ++e) saved.stats.set_item(2 + e, double(r.all_tokens_per_expert[size_t(e)]));
}

void Router::route_on_device(const Tensor& logits, Saved& saved) const {
  const int64_t T = logits.dim(0), E = num_experts_;
  const Device device = logits.device();
  const ops::TopKRouting r = topk_routing(params_, T);
  if (!expert_bias_.empty() && !expert_bias_on_device_.defined()) {
    Tensor host = Tensor::empty({E}, logits.dtype());
    for (int64_t e = 0; e < E; ++e) host.set_item(e, expert_bias_[size_t(e)]);
    expert_bias_on_device_ = host.to(device);
  }
  saved.logits = logits;
  saved.probs = Tensor::empty({T, E}, logits.dtype(), device);
  saved.topk_experts = Tensor::empty({T, params_.topk}, DType::i32, device);
  saved.sums = Tensor::empty({ops::routing_sums_size(E, r)}, DType::f64, device);
  ops::moe_route(saved.probs, saved.topk_experts, saved.sums, logits, expert_bias_on_device_, r);
  if (sequence_shards_) sequence_shards_->all_reduce(saved.sums, ReduceOp::sum);
  saved.stats = Tensor::empty({2 + E}, logits.dtype(), device);
  ops::moe_route_losses(saved.stats, saved.sums, r);
}

Tensor Router::backward(const Tensor& dprobs, const Saved& saved, DType x_dtype) const {
  const RoutingParams& p = params_;
  Tensor dlogits;
  if (routes_on_host_) {
    const std::vector<double> dl =
        route_backward(to_host_doubles(dprobs), saved.host_logits, saved.routing, p, saved.aux_loss_grad_scale);
    Tensor dlogits_host = Tensor::empty({saved.routing.num_tokens, num_experts_}, saved.input.dtype());
    for (int64_t i = 0; i < dlogits_host.numel(); ++i) dlogits_host.set_item(i, dl[size_t(i)]);
    dlogits = dlogits_host.to(saved.input.device());
  } else {
    const ops::TopKRouting r = topk_routing(params_, saved.logits.dim(0));
    const bool aux = p.load_balancing != LoadBalancingType::none && p.aux_loss_coeff > 0.0;
    dlogits = Tensor::empty(saved.logits.shape(), saved.logits.dtype(), saved.logits.device());
    ops::moe_route_backward(dlogits, dprobs, saved.logits, saved.topk_experts, saved.sums, r,
                            aux ? saved.aux_loss_grad_scale * p.aux_loss_coeff : 0.0,
                            saved.aux_loss_grad_scale * p.z_loss_coeff);
  }
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor no_bias;
  ops::linear_backward(dx, weight_->main_grad, no_bias, dlogits, saved.input, weight_in_router_dtype(),
                       ops::GradWrite::accumulate);
  return in_dtype(dx, x_dtype);
}

std::vector<double> Router::tokens_since_update() const {
  if (expert_bias_.empty()) return {};
  if (!tokens_since_update_.defined()) return std::vector<double>(expert_bias_.size(), 0.0);
  return to_host_doubles(tokens_since_update_);
}

void Router::update_expert_bias(const std::vector<double>& global_counts) {
  if (expert_bias_.empty()) return;
  moe::update_expert_bias(expert_bias_, global_counts, bias_update_rate_);
  if (tokens_since_update_.defined()) tokens_since_update_.zero();
  expert_bias_on_device_ = Tensor();  // copied again at the next forward
}

void Router::set_expert_bias(std::vector<double> bias) {
  MEGATRON_CHECK(bias.size() == expert_bias_.size(),
                 expert_bias_name_ << ": " << bias.size() << " values for " << expert_bias_.size() << " experts");
  expert_bias_ = std::move(bias);
  expert_bias_on_device_ = Tensor();
}

}  // namespace megatron::moe
