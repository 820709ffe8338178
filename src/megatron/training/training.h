#pragma once
// pretrain(): Megatron's training loop for GPT: data, model, DDP and optimizer, schedule,
// logging, evaluation, checkpoints. Data parallelism comes from the parallel context: each
// data-parallel rank trains on its slice of every global batch, gradients are reduced by DDP
// (distributed/ddp.h), and the reported loss is the global batch's.
#include <memory>
#include <optional>
#include <vector>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/launch.h"
#include "megatron/training/arguments.h"
#include "megatron/training/exit_conditions.h"

namespace megatron {

struct TrainingSummary {
  int64_t iterations_run = 0;
  std::vector<double> train_losses;  // lm loss of every iteration run, in order
  std::vector<double> grad_norms;    // pre-clip gradient norm of every iteration run (NaN: skipped on overflow)
  std::vector<double> loss_scales;   // loss scale after each iteration's update (1 without scaling)
  std::vector<bool> skipped;         // whether each iteration's update was skipped
  std::vector<double> valid_losses;  // each periodic evaluation's loss, in order
  std::vector<double> params_norms;  // --log-params-norm: the norm after each iteration that logged it
  std::vector<double> num_zeros_in_grad;  // --log-num-zeros-in-grad: each updating iteration's count
  // After the last iteration, as Megatron's pretrain does: the validation split once more, then
  // the test split, eval_iters global batches each; unset when that split is not built.
  std::optional<double> end_valid_loss, test_loss;
  int64_t test_samples = 0;  // samples the test evaluation read
  // Set when the run stopped before its last iteration (exit_conditions.h); the evaluations after
  // training are then skipped, as in Megatron.
  std::optional<EarlyExit> early_exit;
  // Bytes this rank holds for weights and main gradients between steps (after the last one) and
  // held at their peak since its data parallelism was set up, and for its optimizer state: Megatron
  // FSDP's shards and gathered buckets (distributed/fully_sharded.h), or the whole buffers.
  int64_t weight_bytes = 0, peak_weight_bytes = 0, grad_bytes = 0, peak_grad_bytes = 0, optimizer_state_bytes = 0;
};

// The whole launched world: `mpi` is the process's runtime under mpirun/srun (args parsed with
// its world size), null for a single process. Builds the parallel groups (GPU = local rank,
// timeouts from --distributed-timeout-minutes) and trains.
TrainingSummary pretrain(const TrainingArgs& args, const std::shared_ptr<MpiRuntime>& mpi = nullptr);

// With groups the caller built (tests run several layouts in one job): groups.world is this run's
// world, groups.dp_cp its data-parallel group; their sizes must match the arguments'. The layers
// take sequence parallelism and its overlap from the arguments (parallel_args.h: model_context).
TrainingSummary pretrain(const TrainingArgs& args, const ParallelContext& groups, Device device);

}  // namespace megatron
