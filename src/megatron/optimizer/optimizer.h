#pragma once
// Mixed-precision AdamW over a ParameterRegistry's flat buffers (Megatron's
// Float16OptimizerWithFloat16Params, ZeRO-0): fp32 master weights (a separate buffer when the
// model computes in bf16; the parameters themselves when they are fp32/f64), fp32 moments,
// global-norm clipping. Weight decay is skipped for parameters whose spec says so (biases,
// norms), as Megatron's wd_mult = 0 for 1-D parameters and biases.
#include <string>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/distributed/parameter.h"
#include "megatron/parallel/comm.h"

namespace megatron {

struct OptimizerStepResult {
  double grad_norm = 0.0;  // pre-clip global L2 norm of the main grads
  bool skipped = false;    // non-finite gradients: no update (counted in the log)
};

class AdamWOptimizer {
 public:
  struct Hyper {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clip_grad = 1.0;
  };
  AdamWOptimizer(ParameterRegistry& registry, const ParallelContext& ctx, const Hyper& hyper);

  // One update with this lr and weight decay from the gradients in the main-grad buffer.
  OptimizerStepResult step(double lr, double weight_decay);
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }

  // Optimizer state as sharded tensors (names "optimizer.<param>.{exp_avg,exp_avg_sq,fp32_param}").
  std::vector<checkpointing::ShardedTensor> sharded_state() const;
  void load_state(const checkpointing::CheckpointReader& reader);
  // After loading model weights into the compute copy: refresh the master weights from them.
  void reload_master_from_model();

 private:
  double global_grad_norm() const;
  ParameterRegistry* registry_;
  const ParallelContext* ctx_;
  Hyper hyper_;
  bool separate_master_;
  Tensor master_, exp_avg_, exp_avg_sq_;
  int64_t step_count_ = 0;
};

}  // namespace megatron
