#include "megatron/transformer/moe/router.h"

#include <algorithm>

#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"

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
               const std::string& prefix)
    : weight_(registry.add({.name = prefix + ".weight",
                            .global_shape = {config.moe.num_moe_experts, config.hidden_size},
                            .init_std = config.init_method_std,
                            .sequence_parallel = ctx.sequence_parallel()})),
      sequence_shards_(ctx.sequence_parallel() ? ctx.tp : nullptr),
      num_experts_(config.moe.num_moe_experts),
      params_(routing_params(config.moe, config.seq_length / (sequence_shards_ ? ctx.tp_size() : 1))),
      bias_update_rate_(config.moe.moe_router_bias_update_rate),
      expert_bias_name_(prefix + ".expert_bias") {
  if (config.moe.moe_router_enable_expert_bias) {
    expert_bias_.assign(size_t(num_experts_), 0.0);
    tokens_since_update_.assign(size_t(num_experts_), 0.0);
  }
}

Tensor Router::weight_in_router_dtype() const { return in_dtype(weight_->data, router_dtype(weight_->data.dtype())); }

const Routing& Router::forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const {
  const int64_t T = x.dim(0);
  saved.input = in_dtype(x, router_dtype(x.dtype()));
  Tensor logits = Tensor::empty({T, num_experts_}, saved.input.dtype(), x.device());
  ops::linear_forward(logits, saved.input, weight_in_router_dtype(), Tensor());
  saved.logits = to_host_doubles(logits);
  SumOverShards sum_over_shards;
  if (sequence_shards_)
    sum_over_shards = [&](std::vector<double>& sums) {
      Tensor host = Tensor::empty({int64_t(sums.size())}, DType::f64);
      std::copy(sums.begin(), sums.end(), host.data<double>());
      Tensor on_device = host.to(x.device());
      sequence_shards_->all_reduce(on_device, ReduceOp::sum);
      sums = to_host_doubles(on_device);
    };
  saved.routing = route(saved.logits, T, num_experts_, params_, expert_bias_, sum_over_shards);
  saved.aux_loss_grad_scale = fwd.aux_loss_grad_scale;
  if (fwd.training && !fwd.recompute && !tokens_since_update_.empty())
    for (int64_t e = 0; e < num_experts_; ++e)
      tokens_since_update_[size_t(e)] += double(saved.routing.all_tokens_per_expert[size_t(e)]);
  return saved.routing;
}

Tensor Router::backward(const std::vector<double>& dprobs, const Saved& saved, DType x_dtype) const {
  const std::vector<double> dl =
      route_backward(dprobs, saved.logits, saved.routing, params_, saved.aux_loss_grad_scale);
  const int64_t T = saved.routing.num_tokens;
  Tensor dlogits_host = Tensor::empty({T, num_experts_}, saved.input.dtype());
  for (int64_t i = 0; i < dlogits_host.numel(); ++i) dlogits_host.set_item(i, dl[size_t(i)]);
  const Tensor dlogits = dlogits_host.to(saved.input.device());
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor no_bias;
  ops::linear_backward(dx, weight_->main_grad, no_bias, dlogits, saved.input, weight_in_router_dtype());
  return in_dtype(dx, x_dtype);
}

void Router::update_expert_bias(const std::vector<double>& global_counts) {
  if (expert_bias_.empty()) return;
  moe::update_expert_bias(expert_bias_, global_counts, bias_update_rate_);
  std::fill(tokens_since_update_.begin(), tokens_since_update_.end(), 0.0);
}

void Router::set_expert_bias(std::vector<double> bias) {
  MEGATRON_CHECK(bias.size() == expert_bias_.size(),
                 expert_bias_name_ << ": " << bias.size() << " values for " << expert_bias_.size() << " experts");
  expert_bias_ = std::move(bias);
}

}  // namespace megatron::moe
