#include "megatron/distributed/distributed_optimizer.h"

#include <cmath>

#include "megatron/distributed/fp8_params.h"
#include "megatron/ops/adamw.h"
#include "megatron/ops/reduce.h"

namespace megatron {

namespace {
// One piece per owned range of a parameter: its elements of the concatenated shards.
std::vector<AdamWState::Piece> shard_pieces(DistributedDataParallel& ddp, const AdamWHyper& hyper) {
  MEGATRON_CHECK(ddp.config().use_distributed_optimizer,
                 "the distributed optimizer needs DDP built with use_distributed_optimizer (its padded buckets)");
  ParameterRegistry& registry = ddp.registry();
  std::vector<AdamWState::Piece> pieces;
  for (const ShardParamRange& r : ddp.shards().params) {
    const ParamSpec& spec = registry.params()[r.param]->spec;
    pieces.push_back({r.in_shards.begin, r.in_shards.end, ddp.grad_of(r), ddp.param_of(r),
                      applies_weight_decay(spec, hyper), spec.embedding_or_output});
  }
  return pieces;
}
}  // namespace

DistributedOptimizer::DistributedOptimizer(DistributedDataParallel& ddp, const ParallelContext& ctx,
                                           const AdamWHyper& hyper, std::unique_ptr<GradScaler> grad_scaler,
                                           const AdamWStateOptions& state_options)
    : Optimizer(ddp.registry(), hyper, ctx.world, std::move(grad_scaler)),
      ddp_(&ddp),
      // f32 state (f64 for f64 models), as the main grads.
      state_(shard_pieces(ddp, hyper), ddp.shards().numel, ddp.registry().device(), ddp.registry().params_dtype(),
             ddp.registry().grad_dtype(), state_options) {
  if (ddp.has_fp8_buckets()) hold_params_in_fp8();
}

void DistributedOptimizer::hold_params_in_fp8() {
  ParameterRegistry& registry = ddp_->registry();
  std::vector<int64_t> ends;
  std::vector<DType> dtypes;
  for (const BucketLayout& bucket : ddp_->layout().buckets) {
    const DType dtype =
        bucket.fp8 ? registry.params()[bucket.params.front()]->fp8->scaling->dtype : registry.params_dtype();
    if (!dtypes.empty() && dtypes.back() == dtype) {
      ends.back() = bucket.range.end;
    } else {
      ends.push_back(bucket.range.end);
      dtypes.push_back(dtype);
    }
  }
  // The gradients hold no memory here (DDP starts them released), so the split's moment holds only
  // the old parameter buffer and its new parts beside the optimizer state.
  registry.split_params(ends, dtypes);
  for (const auto& p : registry.params())
    if (p->fp8) fp8_params_.push_back(p.get());
  // The delayed recipe's scale is known before the update, so AdamW casts the codes in its pass
  // (ops::adamw_step_fp8); tensorwise needs the updated weight's amax first: a pass of its own.
  fp8_cast_in_update_ = fp8_params_.front()->fp8->recipe.scaling == ops::Fp8Scaling::delayed;
  std::vector<Tensor> params;
  std::vector<ops::Fp8TensorScaling*> fp8_casts;
  for (const ShardParamRange& r : ddp_->shards().params) {
    params.push_back(ddp_->param_of(r));
    const Parameter& p = *registry.params()[r.param];
    fp8_casts.push_back(p.fp8 && fp8_cast_in_update_ ? p.fp8->scaling : nullptr);
  }
  state_.set_params(params, fp8_casts);  // the pieces' old views held the flat buffer
  cast_fp8_params();
  ddp_->start_param_gather();
  ddp_->finish_param_gather();
}

void DistributedOptimizer::cast_fp8_params() {
  std::vector<Fp8ParamShard> shards;
  for (const ShardParamRange& r : ddp_->shards().params) {
    const Parameter& p = *registry_->params()[r.param];
    if (p.fp8) shards.push_back({&p, state_.master_values(r.in_shards.begin, r.in_shards.end), ddp_->param_of(r)});
  }
  cast_fp8_param_shards(shards, fp8_params_, &ddp_->group());
}

double DistributedOptimizer::sum_over_grad_shards(const ParameterReduction& reduce, bool whole_shards,
                                                  DType acc_dtype) const {
  // The shards of the group's ranks tile every parameter once; a parameter replicated across TP
  // counts on TP rank 0 only, the tied embedding on the first pipeline stage only (Megatron's get_grad_norm_fp32 over
  // the distributed-optimizer instance: DP x CP, then the model-parallel ranks). Expert buckets are sharded over expert
  // DP and hold other experts on each EP rank: their terms are summed over both.
  const RankShards& shards = ddp_->shards();
  const BufferLayout& layout = ddp_->layout();
  Tensor dense = Tensor::zeros({1}, acc_dtype, registry_->device());
  Tensor expert = Tensor::zeros({1}, acc_dtype, registry_->device());
  const auto acc_of = [&](size_t bucket) -> Tensor& { return layout.buckets[bucket].expert_parallel ? expert : dense; };
  if (whole_shards && !holds_duplicates_) {
    for (size_t b = 0; b < shards.in_buffer.size(); ++b) reduce(acc_of(b), ddp_->grad_shard(b));
  } else {
    for (const ShardParamRange& r : shards.params)
      if (!registry_->params()[r.param]->is_duplicate()) reduce(acc_of(r.bucket), ddp_->grad_of(r));
  }
  const ParallelContext& ctx = ddp_->context();
  ddp_->group().all_reduce(dense, ReduceOp::sum);
  ctx.mp->all_reduce(dense, ReduceOp::sum);
  if (!ddp_->has_expert_buckets()) return dense.item(0);
  ctx.expert_dp->all_reduce(expert, ReduceOp::sum);
  ctx.expert_mp->all_reduce(expert, ReduceOp::sum);  // expert TP x EP x PP: every expert shard once
  return dense.item(0) + expert.item(0);
}

double DistributedOptimizer::global_grad_norm() const {
  // Whole shards where nothing is a duplicate: the padding between parameters holds zeros.
  return std::sqrt(sum_over_grad_shards(ops::sum_squares, /*whole_shards=*/true, registry_->grad_dtype()));
}

double DistributedOptimizer::count_zero_grads() const {
  // Not whole shards: the padding's zeros are no gradients. f64: exact counts.
  return sum_over_grad_shards(ops::count_zeros, /*whole_shards=*/false, DType::f64);
}

void DistributedOptimizer::count_nonfinite_grads(Tensor& acc) const {
  for (size_t b = 0; b < ddp_->shards().in_buffer.size(); ++b) ops::count_nonfinite(acc, ddp_->grad_shard(b));
}

void DistributedOptimizer::update(const StepRates& rates, float grad_scale) {
  update_parts(state_, part_ranges(), step_params(grad_scale), rates);
  if (!fp8_params_.empty() && !fp8_cast_in_update_) cast_fp8_params();
  ddp_->start_param_gather();
  if (!ddp_->config().overlap_param_gather) ddp_->finish_param_gather();
}

// Released weights come back from this rank's masters for its shards and from the others' for
// the rest of each bucket: the gather a step makes, though nothing changed.
void DistributedOptimizer::keep_params() {
  if (!restore_released_params(state_, part_ranges())) return;
  ddp_->start_param_gather();
  ddp_->finish_param_gather();
}

Optimizer::PartRanges DistributedOptimizer::part_ranges() const {
  PartRanges parts;
  for (const Range& shard : ddp_->shards().in_shards) parts.emplace_back(shard.begin, shard.end);
  return parts;
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
    add("exp_avg", state_.exp_avg(r.in_shards.begin, r.in_shards.end));
    add("exp_avg_sq", state_.exp_avg_sq(r.in_shards.begin, r.in_shards.end));
    if (state_.master_in_checkpoint()) add("fp32_param", state_.master_values(r.in_shards.begin, r.in_shards.end));
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
    load("exp_avg", state_.exp_avg(r.in_shards.begin, r.in_shards.end));
    load("exp_avg_sq", state_.exp_avg_sq(r.in_shards.begin, r.in_shards.end));
    if (state_.master_in_checkpoint())
      state_.load_master(r.in_shards.begin, r.in_shards.end, [&](Tensor& t) { load("fp32_param", t); });
  }
  // Masters that equal the parameters (loaded before the optimizer) are rebuilt from them.
  if (!state_.master_in_checkpoint()) state_.reload_master();
  if (fp8_params_.empty()) return;
  // The FP8 weights again from the masters, at the scale the checkpoint restored; each rank's
  // shard amax joins the restored history[0] (one rank's shard's) as in the run that saved it.
  cast_fp8_params();
  ddp_->start_param_gather();
  ddp_->finish_param_gather();
}

void DistributedOptimizer::reload_master_from_model() {
  state_.reload_master();
  // FP8 parameters: the masters from the values their codes stand for.
  for (const ShardParamRange& r : ddp_->shards().params) {
    const Parameter& p = *registry_->params()[r.param];
    if (!p.fp8) continue;
    Tensor master = state_.master_values(r.in_shards.begin, r.in_shards.end);
    master.copy_from(fp8_param_values(p, ddp_->param_of(r), master.dtype()));
  }
}

}  // namespace megatron
