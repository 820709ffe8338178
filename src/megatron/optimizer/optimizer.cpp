#include "megatron/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "megatron/ops/adamw.h"
#include "megatron/ops/reduce.h"

namespace megatron {

namespace {
constexpr std::string_view kOptimizerStatePrefix = "optimizer.";
}

std::string optimizer_state_name(const std::string& param_name, const std::string& what) {
  return std::string(kOptimizerStatePrefix) + param_name + "." + what;
}

bool is_optimizer_state_name(const std::string& name) { return name.starts_with(kOptimizerStatePrefix); }

bool applies_weight_decay(const ParamSpec& spec, const AdamWHyper& hyper) {
  const bool qk_layernorm =
      spec.name.find("q_layernorm.") != std::string::npos || spec.name.find("k_layernorm.") != std::string::npos;
  return spec.weight_decay || (hyper.decay_qk_layernorm && qk_layernorm);
}

bool is_saved_replica(const Parameter& p, const ParallelContext& ctx) {
  const Communicator& replicas = p.spec.expert_parallel ? *ctx.expert_dp : *ctx.dp_cp;
  return !p.is_duplicate() && replicas.rank() == 0;
}

Optimizer::Optimizer(ParameterRegistry& registry, const AdamWHyper& hyper,
                     std::shared_ptr<Communicator> found_inf_group, std::unique_ptr<GradScaler> grad_scaler)
    : registry_(&registry),
      hyper_(hyper),
      holds_duplicates_(std::any_of(registry.params().begin(), registry.params().end(),
                                    [](const auto& p) { return p->is_duplicate(); })),
      found_inf_group_(std::move(found_inf_group)),
      grad_scaler_(std::move(grad_scaler)) {}

OptimizerStepResult Optimizer::step(const StepRates& rates) {
  OptimizerStepResult result;
  // The scale the loss was multiplied by in this step's backward; update() may change it.
  const double inv_scale = grad_scaler_ ? double(grad_scaler_->inv_scale()) : 1.0;
  if (grad_scaler_) {
    Tensor count = Tensor::zeros({1}, registry_->grad_dtype(), registry_->device());
    count_nonfinite_grads(count);
    found_inf_group_->all_reduce(count, ReduceOp::max);
    const bool found_inf = count.item(0) > 0.0;
    grad_scaler_->update(found_inf);
    if (found_inf) {
      keep_params();
      result.skipped = true;
      return result;
    }
  }
  const double grad_norm = global_grad_norm() * inv_scale;
  result.grad_norm = grad_norm;
  if (!std::isfinite(grad_norm)) {
    keep_params();
    result.skipped = true;
    return result;
  }
  // Before the update, which may give released parts' gradients back (update_parts).
  if (log_num_zeros_in_grad_) result.num_zeros_in_grad = count_zero_grads();
  double clip_coeff = 1.0;
  if (hyper_.clip_grad > 0.0) clip_coeff = std::min(1.0, hyper_.clip_grad / (grad_norm + 1e-6));
  ++step_count_;
  update(rates, float(clip_coeff * inv_scale));
  return result;
}

void Optimizer::update_parts(AdamWState& state, const PartRanges& parts, const ops::AdamWParams& params,
                             const StepRates& rates) const {
  const size_t n = registry_->param_buffers().size();
  bool released = false;
  for (size_t k = 0; k < n; ++k) released = released || !registry_->params_held(k);
  if (!released) {
    state.step(params, rates);
    return;
  }
  MEGATRON_CHECK(parts.size() == n && registry_->grad_parts() == n,
                 "released weights need the parameters and gradients in the same parts (DDP's buckets): "
                     << n << " parameter parts, " << registry_->grad_parts() << " gradient parts, " << parts.size()
                     << " ranges of the optimizer's state");
  for (size_t k = 0; k < n; ++k) {
    const bool part_released = !registry_->params_held(k);
    if (part_released) registry_->acquire_params(k);
    state.step(params, rates, parts[k].first, parts[k].second);
    if (part_released) registry_->release_grads(k);
  }
}

bool Optimizer::restore_released_params(AdamWState& state, const PartRanges& parts) const {
  bool restored = false;
  for (size_t k = 0; k < registry_->param_buffers().size(); ++k) {
    if (registry_->params_held(k)) continue;
    MEGATRON_CHECK(k < parts.size(), "parameter part " << k << " was released but the optimizer's state has "
                                                       << parts.size() << " part ranges");
    registry_->acquire_params(k);
    state.write_params_from_masters(parts[k].first, parts[k].second);
    restored = true;
  }
  return restored;
}

namespace {
// One piece per parameter, in buffer order: its elements of the flat buffers.
std::vector<AdamWState::Piece> parameter_pieces(ParameterRegistry& registry, const AdamWHyper& hyper) {
  std::vector<AdamWState::Piece> pieces;
  for (const auto& p : registry.params()) {
    const int64_t n = shape_numel(p->local_shape);
    pieces.push_back({p->buffer_offset, p->buffer_offset + n, p->main_grad.view({n}), p->data.view({n}),
                      applies_weight_decay(p->spec, hyper), p->spec.embedding_or_output});
  }
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  return pieces;
}
}  // namespace

AdamWOptimizer::AdamWOptimizer(ParameterRegistry& registry, const ParallelContext& ctx, const Hyper& hyper,
                               std::unique_ptr<GradScaler> grad_scaler, const AdamWStateOptions& state_options)
    : Optimizer(registry, hyper, ctx.mp, std::move(grad_scaler)),
      ctx_(&ctx),
      // f32 state (f64 for f64 models), as the main grads.
      state_(parameter_pieces(registry, hyper), registry.num_local_elements(), registry.device(),
             registry.params_dtype(), registry.grad_dtype(), state_options) {}

namespace {
// Whether the experts are split otherwise than the dense parameters (by EP, or an expert TP of
// their own): then their norm is summed over the expert model-parallel group (expert TP x EP x PP).
bool experts_split_apart(const ParameterRegistry& registry) {
  return registry.ep_size() > 1 || registry.expert_tp_size() != registry.tp_size();
}

// dense summed over MP + expert summed over expert MP, the accumulators of this rank's terms.
double reduced_sum(Tensor& dense, Tensor& expert, bool split_experts, const ParallelContext& ctx) {
  ctx.mp->all_reduce(dense, ReduceOp::sum);
  if (!split_experts) return dense.item(0);
  ctx.expert_mp->all_reduce(expert, ReduceOp::sum);
  return dense.item(0) + expert.item(0);
}
}  // namespace

double sum_over_each_parameter_once(const ParameterRegistry& registry, const ParallelContext& ctx,
                                    const std::function<const Tensor&(const Parameter&)>& of,
                                    const ParameterReduction& reduce, DType acc_dtype) {
  Tensor dense = Tensor::zeros({1}, acc_dtype, registry.device());
  Tensor expert = Tensor::zeros({1}, acc_dtype, registry.device());
  const bool split_experts = experts_split_apart(registry);
  for (const auto& p : registry.params())
    if (!p->is_duplicate()) reduce(split_experts && p->spec.expert_parallel ? expert : dense, of(*p));
  return reduced_sum(dense, expert, split_experts, ctx);
}

double norm_of_each_parameter_once(const ParameterRegistry& registry, const ParallelContext& ctx,
                                   const std::function<const Tensor&(const Parameter&)>& of) {
  // f32 accumulators (f64 for f64 models), whatever the tensors' dtype.
  return std::sqrt(sum_over_each_parameter_once(registry, ctx, of, ops::sum_squares, registry.grad_dtype()));
}

double AdamWOptimizer::global_grad_norm() const {
  // Megatron's get_grad_norm_fp32 (norm_of_each_parameter_once); without duplicates or experts
  // apart, one reduction over whole buffer ranges, not one per parameter: the padding between
  // parameters holds zeros.
  if (holds_duplicates_ || experts_split_apart(*registry_))
    return norm_of_each_parameter_once(*registry_, *ctx_,
                                       [](const Parameter& p) -> const Tensor& { return p.main_grad; });
  Tensor dense = Tensor::zeros({1}, registry_->grad_dtype(), registry_->device()), unused;
  for (const Tensor& grads : registry_->grad_buffers()) ops::sum_squares(dense, grads);
  return std::sqrt(reduced_sum(dense, unused, false, *ctx_));
}

double AdamWOptimizer::count_zero_grads() const {
  return sum_over_each_parameter_once(
      *registry_, *ctx_, [](const Parameter& p) -> const Tensor& { return p.main_grad; }, ops::count_zeros, DType::f64);
}

ops::AdamWParams Optimizer::step_params(float grad_scale) const {
  return {.beta1 = float(hyper_.beta1),
          .beta2 = float(hyper_.beta2),
          .eps = float(hyper_.eps),
          .grad_scale = grad_scale,
          .step = step_count()};
}

void AdamWOptimizer::count_nonfinite_grads(Tensor& acc) const {
  for (const Tensor& grads : registry_->grad_buffers()) ops::count_nonfinite(acc, grads);
}

void AdamWOptimizer::update(const StepRates& rates, float grad_scale) {
  update_parts(state_, part_ranges(), step_params(grad_scale), rates);
}

void AdamWOptimizer::keep_params() { restore_released_params(state_, part_ranges()); }

Optimizer::PartRanges AdamWOptimizer::part_ranges() const {
  PartRanges parts;
  for (size_t k = 0; k < registry_->param_buffers().size(); ++k) {
    const int64_t begin = registry_->param_part_begin(k);
    parts.emplace_back(begin, begin + registry_->param_buffers()[k].numel());
  }
  return parts;
}

std::vector<checkpointing::ShardedTensor> AdamWOptimizer::sharded_state(StateCopies copies) const {
  std::vector<checkpointing::ShardedTensor> out;
  for (const auto& p : registry_->params()) {
    if (copies == StateCopies::one_replica && !is_saved_replica(*p, *ctx_)) continue;  // another rank saves it
    const int64_t begin = p->buffer_offset, end = begin + shape_numel(p->local_shape);
    auto add = [&](const std::string& what, const Tensor& flat) {
      for (const auto& slice : p->global_slices_of(flat.view(p->local_shape)))
        out.push_back(
            {optimizer_state_name(p->spec.name, what), p->spec.global_shape, slice.global_offset, slice.local});
    };
    add("exp_avg", state_.exp_avg(begin, end));
    add("exp_avg_sq", state_.exp_avg_sq(begin, end));
    if (state_.master_in_checkpoint()) add("fp32_param", state_.master_values(begin, end));
  }
  return out;
}

void AdamWOptimizer::load_state(const checkpointing::CheckpointReader& reader) {
  for (const auto& p : registry_->params()) {
    const int64_t begin = p->buffer_offset, end = begin + shape_numel(p->local_shape);
    auto load = [&](const std::string& what, const Tensor& flat) {
      for (auto& slice : p->global_slices_of(flat.view(p->local_shape)))
        reader.load(optimizer_state_name(p->spec.name, what), slice.global_offset, slice.local);
    };
    load("exp_avg", state_.exp_avg(begin, end));
    load("exp_avg_sq", state_.exp_avg_sq(begin, end));
    if (state_.master_in_checkpoint()) state_.load_master(begin, end, [&](Tensor& t) { load("fp32_param", t); });
  }
  // Masters that equal the parameters (loaded before the optimizer) are rebuilt from them.
  if (!state_.master_in_checkpoint()) state_.reload_master();
}

void AdamWOptimizer::reload_master_from_model() { state_.reload_master(); }

}  // namespace megatron
