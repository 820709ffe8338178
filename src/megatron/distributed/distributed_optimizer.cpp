#include "megatron/distributed/distributed_optimizer.h"

#include <cmath>

#include "megatron/ops/adamw.h"
#include "megatron/ops/reduce.h"

namespace megatron {

namespace {
Tensor slice_of(const Tensor& flat, const Range& r) { return flat.slice(r.begin, r.end); }
}  // namespace

DistributedOptimizer::DistributedOptimizer(DistributedDataParallel& ddp, const ParallelContext& ctx,
                                           const AdamWHyper& hyper, std::unique_ptr<GradScaler> grad_scaler)
    : Optimizer(ddp.registry(), hyper, ctx.world, std::move(grad_scaler)), ddp_(&ddp) {
  MEGATRON_CHECK(ddp.config().use_distributed_optimizer,
                 "the distributed optimizer needs DDP built with use_distributed_optimizer (its padded buckets)");
  const RankShards& shards = ddp.shards();
  const Tensor& params = registry_->param_buffer();
  const DType state_dtype = registry_->grad_dtype();  // f32, or f64 for f64 models
  separate_master_ = params.dtype() != state_dtype;
  exp_avg_ = Tensor::zeros({shards.numel}, state_dtype, params.device());
  exp_avg_sq_ = Tensor::zeros({shards.numel}, state_dtype, params.device());
  if (separate_master_) {
    master_ = Tensor::zeros({shards.numel}, state_dtype, params.device());
    reload_master_from_model();
  }
}

Tensor DistributedOptimizer::master_of(const ShardParamRange& r) const {
  return separate_master_ ? slice_of(master_, r.in_shards) : slice_of(registry_->param_buffer(), r.in_buffer);
}

double DistributedOptimizer::global_grad_norm() const {
  // The shards of the group's ranks tile every parameter once; a parameter replicated across TP
  // counts on TP rank 0 only, the tied embedding on the first pipeline stage only (Megatron's get_grad_norm_fp32 over
  // the distributed-optimizer instance: DP x CP, then the model-parallel ranks). Expert buckets are sharded over expert
  // DP and hold other experts on each EP rank: their squares are summed over both.
  const Tensor& grads = registry_->grad_buffer();
  const RankShards& shards = ddp_->shards();
  const BufferLayout& layout = ddp_->layout();
  Tensor dense = Tensor::zeros({1}, grads.dtype(), grads.device());
  Tensor expert = Tensor::zeros({1}, grads.dtype(), grads.device());
  const auto acc_of = [&](size_t bucket) -> Tensor& { return layout.buckets[bucket].expert_parallel ? expert : dense; };
  if (!holds_duplicates_) {
    for (size_t b = 0; b < shards.in_buffer.size(); ++b)
      ops::sum_squares(acc_of(b), slice_of(grads, shards.in_buffer[b]));
  } else {
    for (const ShardParamRange& r : shards.params)
      if (!registry_->params()[r.param]->is_duplicate())
        ops::sum_squares(acc_of(r.bucket), slice_of(grads, r.in_buffer));
  }
  const ParallelContext& ctx = ddp_->context();
  ddp_->group().all_reduce(dense, ReduceOp::sum);
  ctx.mp->all_reduce(dense, ReduceOp::sum);
  if (!ddp_->has_expert_buckets()) return std::sqrt(dense.item(0));
  ctx.expert_dp->all_reduce(expert, ReduceOp::sum);
  ctx.expert_mp->all_reduce(expert, ReduceOp::sum);  // expert TP x EP x PP: every expert shard once
  return std::sqrt(dense.item(0) + expert.item(0));
}

void DistributedOptimizer::count_nonfinite_grads(Tensor& acc) const {
  for (const Range& shard : ddp_->shards().in_buffer)
    ops::count_nonfinite(acc, slice_of(registry_->grad_buffer(), shard));
}

void DistributedOptimizer::update(double lr, double weight_decay, float grad_scale) {
  for (const ShardParamRange& r : ddp_->shards().params) {
    const Parameter& p = *registry_->params()[r.param];
    Tensor master = master_of(r);
    Tensor m = slice_of(exp_avg_, r.in_shards), v = slice_of(exp_avg_sq_, r.in_shards);
    Tensor model_copy = separate_master_ ? slice_of(registry_->param_buffer(), r.in_buffer) : Tensor();
    ops::adamw_step(master, m, v, slice_of(registry_->grad_buffer(), r.in_buffer), model_copy,
                    {.lr = float(lr),
                     .beta1 = float(hyper_.beta1),
                     .beta2 = float(hyper_.beta2),
                     .eps = float(hyper_.eps),
                     .weight_decay = p.spec.weight_decay ? float(weight_decay) : 0.0f,
                     .grad_scale = grad_scale,
                     .step = step_count()});
  }
  ddp_->start_param_gather();
  if (!ddp_->config().overlap_param_gather) ddp_->finish_param_gather();
}

std::vector<checkpointing::ShardedTensor> DistributedOptimizer::sharded_state(StateCopies copies) const {
  std::vector<checkpointing::ShardedTensor> out;
  for (const ShardParamRange& r : ddp_->shards().params) {
    const Parameter& p = *registry_->params()[r.param];
    if (copies == StateCopies::one_replica && p.is_duplicate()) continue;  // TP rank 0 saves it
    const auto add = [&](const char* what, const Tensor& range) {
      for (const Parameter::FlatBox& box : p.global_boxes(r.in_param.begin, r.in_param.end)) {
        const int64_t at = box.flat_begin - r.in_param.begin;
        out.push_back({optimizer_state_name(p.spec.name, what), p.spec.global_shape, box.global_offset,
                       range.slice(at, at + shape_numel(box.shape)).view(box.shape)});
      }
    };
    add("exp_avg", slice_of(exp_avg_, r.in_shards));
    add("exp_avg_sq", slice_of(exp_avg_sq_, r.in_shards));
    if (separate_master_) add("fp32_param", master_of(r));
  }
  return out;
}

void DistributedOptimizer::load_state(const checkpointing::CheckpointReader& reader) {
  for (const ShardParamRange& r : ddp_->shards().params) {
    const Parameter& p = *registry_->params()[r.param];
    const auto load = [&](const char* what, const Tensor& range) {
      for (const Parameter::FlatBox& box : p.global_boxes(r.in_param.begin, r.in_param.end)) {
        const int64_t at = box.flat_begin - r.in_param.begin;
        Tensor dest = range.slice(at, at + shape_numel(box.shape)).view(box.shape);
        reader.load(optimizer_state_name(p.spec.name, what), box.global_offset, dest);
      }
    };
    load("exp_avg", slice_of(exp_avg_, r.in_shards));
    load("exp_avg_sq", slice_of(exp_avg_sq_, r.in_shards));
    if (separate_master_) load("fp32_param", master_of(r));
  }
}

void DistributedOptimizer::reload_master_from_model() {
  if (!separate_master_) return;
  for (const ShardParamRange& r : ddp_->shards().params) {
    Tensor master = master_of(r);
    master.copy_from(slice_of(registry_->param_buffer(), r.in_buffer));
  }
}

}  // namespace megatron
