#include "megatron/transformer/moe/shared_experts.h"

#include "megatron/ops/elementwise.h"
#include "megatron/ops/sigmoid_gate.h"

namespace megatron::moe {
namespace {

TransformerConfig shared_expert_config(const TransformerConfig& config) {
  TransformerConfig shared = config;
  shared.ffn_hidden_size = config.moe.moe_shared_expert_intermediate_size;
  return shared;
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

}  // namespace

SharedExperts::SharedExperts(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                             const std::string& prefix)
    : mlp_(registry, ctx, shared_expert_config(config), prefix) {
  if (config.moe.moe_shared_expert_gate)
    gate_weight_ = registry.add({.name = prefix + ".gate_weight",
                                 .global_shape = {1, config.hidden_size},
                                 .init_std = config.init_method_std,
                                 .sequence_parallel = ctx.sequence_parallel()});
}

void SharedExperts::Saved::count(ActivationMemory& m) const {
  mlp.count(m);
  for (const Tensor* t : {&input, &output, &score}) m.add(*t);
}

Tensor SharedExperts::forward(const Tensor& x, Saved& saved) const {
  const Tensor out = mlp_.forward(x, saved.mlp);
  if (!gate_weight_) return out;
  Tensor y = empty_like(out);
  saved.score = Tensor::empty({x.numel() / x.dim(-1)}, x.dtype() == DType::f64 ? DType::f64 : DType::f32, x.device());
  ops::sigmoid_gate_forward(y, saved.score, out, x, gate_weight_->data);
  saved.input = x;
  saved.output = out;
  return y;
}

Tensor SharedExperts::backward(const Tensor& dy, const Saved& saved) const {
  if (!gate_weight_) return mlp_.backward(dy, saved.mlp);
  Tensor dout = empty_like(dy), dx_gate = empty_like(dy);
  ops::sigmoid_gate_backward(dout, dx_gate, gate_weight_->main_grad, dy, saved.output, saved.input, gate_weight_->data,
                             saved.score);
  Tensor dx = mlp_.backward(dout, saved.mlp);
  ops::add(dx, dx, dx_gate);
  return dx;
}

}  // namespace megatron::moe
