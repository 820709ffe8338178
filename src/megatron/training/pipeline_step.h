#pragma once
// The micro-batches of one global batch through this rank's model chunks: the rank's schedule
// (pipeline_parallel/schedule.h: 1F1B, interleaved with more than one chunk, or forward-only for
// evaluation) run by run_schedule with each chunk's stage_forward and stage_backward. At PP = 1
// the schedule is forward then backward of each micro-batch in turn, the plain
// gradient-accumulation loop.
#include <functional>
#include <vector>

#include "megatron/models/gpt/model_chunks.h"
#include "megatron/training/arguments.h"

namespace megatron {

struct MicroBatchRun {
  // The data this rank's chunks read (tokens on the first stage, labels and loss mask on the last,
  // segment ids on every stage under document masking); empty where none does.
  MicroBatch batch;
  ForwardContext fwd;
  float loss_grad_scale = 1.0f;  // the last stage's loss gradient is scaled by this
};

struct PipelineStepShape {
  int64_t micro_batch_size = 1;       // the (S, B, H) tensors between stages: B
  int64_t microbatch_group_size = 0;  // --microbatch-group-size-per-virtual-pipeline-stage; 0: P
  bool forward_only = false;          // evaluation
  bool overlap_p2p = false;           // TrainingArgs::pipeline_overlaps_p2p: over ctx.pp_channels
};

// The shape of `args`'s steps.
PipelineStepShape pipeline_step_shape(const TrainingArgs& args, bool forward_only);

// Whether this rank's chunks read the data loader: the first stage embeds the tokens (and learned
// positions), the last computes the loss from labels and loss mask, and under document masking
// (--reset-attention-mask) every layer's attention needs the segment ids. Other stages only
// receive activations and read nothing; those that read keep the loader's order.
bool stage_reads_data(const ModelChunks& model, bool document_masking);

struct PipelineHooks {
  // Around each micro-batch's forward and backward through a chunk (the compute timers).
  std::function<void(int64_t microbatch)> before_forward, after_backward;
  // On the last stage, each micro-batch's loss as its forward computes it (the NaN check).
  std::function<void(int64_t microbatch, const LossSums& loss)> on_loss;
  // Before micro-batch m's backward through a chunk (DDP's last-micro-batch flag: each chunk's
  // gradients are final after its backward of the last micro-batch).
  std::function<void(int64_t microbatch)> before_backward;
  // After each micro-batch's forward through a chunk (statistics of its layers: MoE loads).
  std::function<void(int64_t microbatch, const GPTModel& chunk)> after_forward;
};

// Runs `microbatches` forward and (unless shape.forward_only) backward through `model`, this
// rank's chunks, communicating over ctx.pp / ctx.pp_grad (blocking) or ctx.pp_channels
// (shape.overlap_p2p). Returns the loss sums over the
// micro-batches, the same on every stage (the last stage's, broadcast over the pipeline group).
LossSums pipeline_forward_backward(ModelChunks& model, const ParallelContext& ctx,
                                   const std::vector<MicroBatchRun>& microbatches, const PipelineStepShape& shape,
                                   const PipelineHooks& hooks = {});

}  // namespace megatron
