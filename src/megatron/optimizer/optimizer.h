#pragma once
// Mixed-precision AdamW over a ParameterRegistry's flat buffers (Megatron's
// Float16OptimizerWithFloat16Params, ZeRO-0): fp32 master weights (a separate buffer when the
// model computes in bf16; the parameters themselves when they are fp32/f64), fp32 moments,
// global-norm clipping. Weight decay is skipped for parameters whose spec says so (biases,
// norms), as Megatron's wd_mult = 0 for 1-D parameters and biases.
//
// Optimizer is what the training loop and checkpoints see; the distributed optimizer
// (distributed/distributed_optimizer.h) is the other implementation. Both store their state
// under the same names, per parameter with its global shape, so a checkpoint of either loads
// into either at any data-parallel size.
//
// Loss scaling (Megatron's MixedPrecisionOptimizer.step, with a GradScaler): the main grads hold
// loss_scale x the true gradients. step() counts their non-finite elements (each rank its own
// grads or shards), takes the max over the grad-stats group, and calls scaler.update(found_inf).
// An overflow skips the step: parameters, moments and the step count stay as they were. Otherwise
// the grads are unscaled inside AdamW (1/loss_scale folded into its gradient scale with the clip
// coefficient, no extra pass) and the reported norm is the unscaled one, which clipping uses.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/optimizer/adamw_state.h"
#include "megatron/optimizer/grad_scaler.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"

namespace megatron {

struct OptimizerStepResult {
  // Pre-clip global L2 norm of the unscaled main grads; absent when an fp16 overflow skipped the
  // step before the norm was taken (Megatron's None, which the log leaves out).
  std::optional<double> grad_norm;
  bool skipped = false;  // non-finite gradients: no update (counted in the log)
  // --log-num-zeros-in-grad: the main grads' elements equal to zero, each parameter's once over
  // the world (Megatron's count_zeros_fp32); absent without the flag or on a skipped step.
  std::optional<double> num_zeros_in_grad = std::nullopt;
};

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clip_grad = 1.0;
  bool decay_qk_layernorm = false;  // OptimizerArgs::decays_qk_layernorm()
};

// Whether weight decay applies to a parameter: where its spec says (not on biases and norm
// weights), and on the query and key layernorms' weights and biases too under decay_qk_layernorm,
// matched by name as Megatron matches them ("q_layernorm." or "k_layernorm." in the name).
bool applies_weight_decay(const ParamSpec& spec, const AdamWHyper& hyper);

// Checkpoint name of one piece of a parameter's optimizer state: "optimizer.<param>.<what>",
// what = exp_avg, exp_avg_sq or fp32_param (the master copy, saved only when it differs from
// the model's parameters).
std::string optimizer_state_name(const std::string& param_name, const std::string& what);
// Whether a checkpoint tensor name is one optimizer_state_name gives.
bool is_optimizer_state_name(const std::string& name);

// Whether this rank holds the copy of `p` that a shared checkpoint saves, one per element over the
// world: not a duplicate (Parameter::is_duplicate), on data-parallel rank 0 (DP x CP) of its
// replicas; an expert-parallel parameter on expert-data-parallel rank 0, since each EP rank holds
// other experts (Megatron's writers: DP rank 0, or expert-DP rank 0, of each (tp, pp, ep)).
bool is_saved_replica(const Parameter& p, const ParallelContext& ctx);

// The global L2 norm of one tensor per parameter this rank holds (`of(p)`: its main grad, or its
// weights), each parameter once over the world, as Megatron's get_grad_norm_fp32 and
// calc_params_l2_norm take it: not the duplicates (Parameter::is_duplicate: TP replicas but TP
// rank 0's, pipeline copies), the squares summed over the model-parallel group, and the experts'
// (where EP or an expert TP of its own splits them) over the expert model-parallel group. The DP
// replicas hold the same values and are not summed. Collective over those groups.
double norm_of_each_parameter_once(const ParameterRegistry& registry, const ParallelContext& ctx,
                                   const std::function<const Tensor&(const Parameter&)>& of);
// The same grouping for any accumulating reduction (ops::sum_squares, ops::count_zeros): the sum
// over the world of `reduce(acc, of(p))`, each parameter once, in accumulators of `acc_dtype`
// (the gradients' f32, or f64 for exact counts).
using ParameterReduction = std::function<void(Tensor& acc, const Tensor& x)>;
double sum_over_each_parameter_once(const ParameterRegistry& registry, const ParallelContext& ctx,
                                    const std::function<const Tensor&(const Parameter&)>& of,
                                    const ParameterReduction& reduce, DType acc_dtype);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at these rates from the (reduced) gradients in the main-grad buffer.
  OptimizerStepResult step(const StepRates& rates);
  // Bytes of the state buffers this rank allocated (master weights when separate from the
  // parameters, Adam moments): what the training log reports as optimizer state.
  virtual size_t state_bytes() const = 0;
  // Bytes of the state kept in host memory (--optimizer-cpu-offload); 0 without offload.
  virtual size_t host_state_bytes() const = 0;
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }

  // --log-num-zeros-in-grad: each step that updates counts its gradients' zeros.
  void set_log_num_zeros_in_grad(bool on) { log_num_zeros_in_grad_ = on; }
  // The factor the loss is multiplied by before backward: the scaler's, 1 without one.
  float loss_scale() const { return grad_scaler_ ? grad_scaler_->scale() : 1.0f; }
  // Null without loss scaling; checkpoints save and restore its state.
  GradScaler* grad_scaler() const { return grad_scaler_.get(); }

  // This rank's state as sharded tensors with global offsets: with one_replica, its share (every
  // element of the global state is returned by exactly one rank: what a shared checkpoint holds);
  // with this_rank, everything it holds, replicas included (a per-rank local checkpoint, which this
  // rank alone reads back).
  enum class StateCopies { one_replica, this_rank };
  virtual std::vector<checkpointing::ShardedTensor> sharded_state(StateCopies copies) const = 0;
  virtual void load_state(const checkpointing::CheckpointReader& reader) = 0;
  // After loading model weights into the compute copy: refresh the master weights from them.
  virtual void reload_master_from_model() = 0;

 protected:
  // found_inf_group: where the overflow flag is max-reduced (Megatron's grad-stats group: the
  // model-parallel group, or the whole world with the distributed optimizer).
  Optimizer(ParameterRegistry& registry, const AdamWHyper& hyper, std::shared_ptr<Communicator> found_inf_group,
            std::unique_ptr<GradScaler> grad_scaler);

  // AdamW's constants for this step (each piece of the state adds its learning rate and weight decay).
  ops::AdamWParams step_params(float grad_scale) const;

  // Index ranges [begin, end) of an optimizer's state, one per part of the registry's buffers.
  using PartRanges = std::vector<std::pair<int64_t, int64_t>>;
  // AdamW on `state`: one update of everything, unless DDP released some parts' weights after the
  // backward (DdpConfig::release_weights_after_backward). Then part by part, parts[k] the state's
  // range of the registry's parameter and gradient part k: a released part takes its weights again
  // just before its update writes them from the masters, and gives its gradients back after it, so
  // at no moment does the step hold every weight beside every gradient.
  void update_parts(AdamWState& state, const PartRanges& parts, const ops::AdamWParams& params,
                    const StepRates& rates) const;
  // A skipped step's parameters: the released parts' weights taken again and written from the
  // unchanged masters, so they are what they were. Returns whether any part was released.
  bool restore_released_params(AdamWState& state, const PartRanges& parts) const;

  ParameterRegistry* registry_;
  AdamWHyper hyper_;
  // Whether a parameter this rank holds is a duplicate (Parameter::is_duplicate: a replica of TP
  // rank 0's, or a pipeline copy), which the grad norm counts elsewhere only. Without one, the norm is one reduction
  // over whole buffer ranges, not one per parameter: the padding between parameters holds zeros.
  bool holds_duplicates_;

 private:
  // acc += non-finite elements among the main grads this rank updates.
  virtual void count_nonfinite_grads(Tensor& acc) const = 0;
  // Global L2 norm of the main grads as stored (scaled).
  virtual double global_grad_norm() const = 0;
  // The main grads' zeros over the world, each parameter once (padding between them not counted).
  virtual double count_zero_grads() const = 0;
  // AdamW over this rank's parameters with step step_count_; grad_scale multiplies the main grads.
  virtual void update(const StepRates& rates, float grad_scale) = 0;
  // A skipped step: the parameters as they were (restore_released_params).
  virtual void keep_params() = 0;

  std::shared_ptr<Communicator> found_inf_group_;
  std::unique_ptr<GradScaler> grad_scaler_;
  int64_t step_count_ = 0;
  bool log_num_zeros_in_grad_ = false;
};

class AdamWOptimizer final : public Optimizer {
 public:
  using Hyper = AdamWHyper;
  // Every rank of the data-parallel group holds the whole state; only DP rank 0 saves it.
  AdamWOptimizer(ParameterRegistry& registry, const ParallelContext& ctx, const Hyper& hyper,
                 std::unique_ptr<GradScaler> grad_scaler = nullptr, const AdamWStateOptions& state_options = {});

  size_t state_bytes() const override { return state_.device_bytes(); }
  size_t host_state_bytes() const override { return state_.host_bytes(); }
  std::vector<checkpointing::ShardedTensor> sharded_state(StateCopies copies) const override;
  void load_state(const checkpointing::CheckpointReader& reader) override;
  void reload_master_from_model() override;

 private:
  void count_nonfinite_grads(Tensor& acc) const override;
  double global_grad_norm() const override;
  double count_zero_grads() const override;
  void update(const StepRates& rates, float grad_scale) override;
  void keep_params() override;
  // The registry's parameter parts in the flat buffer's elements (the state's index space).
  PartRanges part_ranges() const;

  const ParallelContext* ctx_;
  AdamWState state_;  // indexed by the flat buffer's elements
};

}  // namespace megatron
