#pragma once
// The micro-batches of one global batch through this rank's pipeline stage: the stage's schedule
// (pipeline_parallel/schedule.h: 1F1B, or forward-only for evaluation) run by run_schedule with
// the model's stage_forward and stage_backward. At PP = 1 the schedule is forward then backward of
// each micro-batch in turn, the plain gradient-accumulation loop.
#include <functional>
#include <vector>

#include "megatron/models/gpt/gpt_model.h"

namespace megatron {

struct MicroBatchRun {
  MicroBatch batch;
  ForwardContext fwd;
  float loss_grad_scale = 1.0f;  // the last stage's loss gradient is scaled by this
};

struct PipelineHooks {
  // On the last stage, each micro-batch's loss as its forward computes it (the NaN check).
  std::function<void(int64_t microbatch, const LossSums& loss)> on_loss;
  // Before micro-batch m's backward (DDP's last-micro-batch flag).
  std::function<void(int64_t microbatch)> before_backward;
  // After each micro-batch's forward on this stage (statistics of this stage's layers: MoE loads).
  std::function<void(int64_t microbatch)> after_forward;
};

// Runs `microbatches` forward and (unless forward_only) backward through `model`, this rank's
// stage, communicating over ctx.pp / ctx.pp_grad. Returns the loss sums over the micro-batches,
// the same on every stage (the last stage's, broadcast over the pipeline group).
LossSums pipeline_forward_backward(GPTModel& model, const ParallelContext& ctx,
                                   const std::vector<MicroBatchRun>& microbatches, bool forward_only,
                                   const PipelineHooks& hooks = {});

}  // namespace megatron
