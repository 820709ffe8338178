#include "megatron/optimizer/optimizer.h"

#include <cmath>

#include "megatron/ops/adamw.h"
#include "megatron/ops/reduce.h"

namespace megatron {

std::string optimizer_state_name(const std::string& param_name, const std::string& what) {
  return "optimizer." + param_name + "." + what;
}

AdamWOptimizer::AdamWOptimizer(ParameterRegistry& registry, const ParallelContext& ctx, const Hyper& hyper)
    : registry_(&registry), ctx_(&ctx), hyper_(hyper) {
  const Tensor& params = registry.param_buffer();
  const DType state_dtype = registry.grad_dtype();  // f32, or f64 for f64 models
  separate_master_ = params.dtype() != state_dtype;
  if (separate_master_) master_ = params.to(state_dtype);
  exp_avg_ = Tensor::zeros(params.shape(), state_dtype, params.device());
  exp_avg_sq_ = Tensor::zeros(params.shape(), state_dtype, params.device());
}

double AdamWOptimizer::global_grad_norm() const {
  // Megatron's get_grad_norm_fp32: every parameter once (a tied weight is one parameter; a
  // parameter replicated across TP counts on TP rank 0 only), the squares summed over the
  // model-parallel group. The DP replicas hold identical reduced grads and are not summed.
  Tensor acc = Tensor::zeros({1}, registry_->grad_dtype(), registry_->grad_buffer().device());
  for (const auto& p : registry_->params())
    if (!p->is_tensor_parallel_duplicate()) ops::sum_squares(acc, p->main_grad);
  ctx_->mp->all_reduce(acc, ReduceOp::sum);
  return std::sqrt(acc.item(0));
}

OptimizerStepResult AdamWOptimizer::step(double lr, double weight_decay) {
  OptimizerStepResult result;
  result.grad_norm = global_grad_norm();
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    return result;
  }
  double clip_coeff = 1.0;
  if (hyper_.clip_grad > 0.0) clip_coeff = std::min(1.0, hyper_.clip_grad / (result.grad_norm + 1e-6));
  ++step_count_;
  for (const auto& p : registry_->params()) {
    Tensor master = separate_master_ ? p->view_of(master_) : p->data;
    Tensor m = p->view_of(exp_avg_), v = p->view_of(exp_avg_sq_);
    Tensor model_copy = separate_master_ ? p->data : Tensor();
    ops::adamw_step(master, m, v, p->main_grad, model_copy,
                    {.lr = float(lr),
                     .beta1 = float(hyper_.beta1),
                     .beta2 = float(hyper_.beta2),
                     .eps = float(hyper_.eps),
                     .weight_decay = p->spec.weight_decay ? float(weight_decay) : 0.0f,
                     .grad_scale = float(clip_coeff),
                     .step = step_count_});
  }
  return result;
}

std::vector<checkpointing::ShardedTensor> AdamWOptimizer::sharded_state() const {
  std::vector<checkpointing::ShardedTensor> out;
  if (ctx_->dp_cp->rank() != 0) return out;  // the other replicas hold the same state
  for (const auto& p : registry_->params()) {
    if (p->is_tensor_parallel_duplicate()) continue;  // TP rank 0 saves it
    auto add = [&](const std::string& what, const Tensor& flat) {
      for (const auto& slice : p->global_slices_of(p->view_of(flat)))
        out.push_back(
            {optimizer_state_name(p->spec.name, what), p->spec.global_shape, slice.global_offset, slice.local});
    };
    add("exp_avg", exp_avg_);
    add("exp_avg_sq", exp_avg_sq_);
    if (separate_master_) add("fp32_param", master_);
  }
  return out;
}

void AdamWOptimizer::load_state(const checkpointing::CheckpointReader& reader) {
  for (const auto& p : registry_->params()) {
    auto load = [&](const std::string& what, const Tensor& flat) {
      for (auto& slice : p->global_slices_of(p->view_of(flat)))
        reader.load(optimizer_state_name(p->spec.name, what), slice.global_offset, slice.local);
    };
    load("exp_avg", exp_avg_);
    load("exp_avg_sq", exp_avg_sq_);
    if (separate_master_) load("fp32_param", master_);
  }
}

void AdamWOptimizer::reload_master_from_model() {
  if (separate_master_) master_.copy_from(registry_->param_buffer());
}

}  // namespace megatron
