#pragma once
// The distributed optimizer (Megatron's DistributedOptimizer, ZeRO-1; reference §9.3): each rank
// of the data-parallel group keeps fp32 master weights and Adam moments only for its shard of
// every DDP bucket (RankShards), which cuts parameters anywhere.
//
// Step (after DistributedDataParallel::finish_grad_sync(), whose reduce-scatter left the reduced
// gradients of this rank's shards in the grad buffer):
//   0. with loss scaling, each rank counts the non-finite grads of its shards and the flag is
//      max-reduced over the whole world (Megatron's grad-stats group for this optimizer), so an
//      overflow in any shard skips the step on every rank;
//   1. global grad norm: sum of squares over this rank's shards, all-reduced over the group;
//   2. clip coefficient, then AdamW on every owned parameter range (weight decay per parameter);
//   3. the updated master values are written into this rank's shards of the compute-dtype
//      parameter buffer (cast into FP8 codes for FP8 parameters, --fp8-param-gather:
//      distributed/fp8_params.h), and DDP all-gathers every bucket (waited on here unless
//      --overlap-param-gather, when the next forward waits for each bucket just before it reads
//      it; ddp.h).
// A non-finite norm skips the update on every rank alike (the norm is global); a skipped step
// gathers nothing, since no parameter changed.
//
// Checkpoints: each owned range is stored as boxes of the parameter's global tensor
// (Parameter::global_boxes) under the same names as AdamWOptimizer's state, so a checkpoint
// written at one data-parallel size (with or without this optimizer) loads at any other: each
// rank reads exactly the global slices it owns now.
#include "megatron/distributed/ddp.h"
#include "megatron/optimizer/optimizer.h"

namespace megatron {

class DistributedOptimizer final : public Optimizer {
 public:
  // ddp must use the distributed optimizer layout and outlive this object; ctx.world carries the
  // overflow flag.
  DistributedOptimizer(DistributedDataParallel& ddp, const ParallelContext& ctx, const AdamWHyper& hyper,
                       std::unique_ptr<GradScaler> grad_scaler = nullptr, const AdamWStateOptions& state_options = {});

  // This rank's shards only: about 1/DP of the replicated optimizer's state.
  size_t state_bytes() const override { return state_.device_bytes(); }
  size_t host_state_bytes() const override { return state_.host_bytes(); }
  std::vector<checkpointing::ShardedTensor> sharded_state(StateCopies copies) const override;
  void load_state(const checkpointing::CheckpointReader& reader) override;
  void reload_master_from_model() override;

 private:
  void count_nonfinite_grads(Tensor& acc) const override;
  double global_grad_norm() const override;
  double count_zero_grads() const override;
  // The sum over the world of `reduce(acc, grads)` over this rank's gradient shards, each parameter
  // once, in `acc_dtype` accumulators; whole_shards: over whole bucket shards (padding included)
  // where nothing is a duplicate.
  double sum_over_grad_shards(const ParameterReduction& reduce, bool whole_shards, DType acc_dtype) const;
  void update(const StepRates& rates, float grad_scale) override;
  void keep_params() override;
  // Each bucket's shard in the concatenated shards (the state's index space), for update_parts.
  PartRanges part_ranges() const;

  // --fp8-param-gather: the parameter buffer split by dtype (FP8 buckets in their weights' FP8
  // dtype, after the masters were taken from the compute-dtype values), then the first cast and
  // gather (distributed/fp8_params.h).
  void hold_params_in_fp8();
  // This rank's shards of the FP8 parameters cast from their masters (not gathered).
  void cast_fp8_params();

  DistributedDataParallel* ddp_;
  AdamWState state_;  // this rank's shards, concatenated (RankShards::numel); offloaded in part or whole
  std::vector<const Parameter*> fp8_params_;  // every FP8 parameter of the registry, registration order
  bool fp8_cast_in_update_ = false;           // AdamW casts them (the delayed recipe)
};

}  // namespace megatron
