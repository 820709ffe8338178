#pragma once
// The distributed optimizer (Megatron's DistributedOptimizer, ZeRO-1; reference §9.3): each rank
// of the data-parallel group keeps fp32 master weights and Adam moments only for its shard of
// every DDP bucket (RankShards), which cuts parameters anywhere.
//
// Step (after DistributedDataParallel::finish_grad_sync(), whose reduce-scatter left the reduced
// gradients of this rank's shards in the grad buffer):
//   1. global grad norm: sum of squares over this rank's shards, all-reduced over the group;
//   2. clip coefficient, then AdamW on every owned parameter range (weight decay per parameter);
//   3. the updated master values are written into this rank's shards of the compute-dtype
//      parameter buffer, and DDP all-gathers every bucket (waited on here unless
//      --overlap-param-gather, when the training loop waits before the next forward).
// A non-finite norm skips the update on every rank alike (the norm is global).
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
  // ddp must use the distributed optimizer layout and outlive this object.
  DistributedOptimizer(DistributedDataParallel& ddp, const AdamWHyper& hyper);

  OptimizerStepResult step(double lr, double weight_decay) override;
  // This rank's shards only: about 1/DP of the replicated optimizer's state.
  size_t state_bytes() const override { return master_.nbytes() + exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }
  std::vector<checkpointing::ShardedTensor> sharded_state() const override;
  void load_state(const checkpointing::CheckpointReader& reader) override;
  void reload_master_from_model() override;

 private:
  double global_grad_norm() const;
  // The master weights of one owned range: a view of the fp32 shard, or of the parameter
  // buffer itself when the model's parameters are fp32/f64 already.
  Tensor master_of(const ShardParamRange& r) const;

  DistributedDataParallel* ddp_;
  ParameterRegistry* registry_;
  AdamWHyper hyper_;
  bool separate_master_;
  Tensor master_, exp_avg_, exp_avg_sq_;  // this rank's shards, concatenated (RankShards::numel)
};

}  // namespace megatron
