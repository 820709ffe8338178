#pragma once
// Runs one rank's schedule (schedule.h) and nothing more: compute actions call the stage's
// forward and backward. Blocking (run_schedule): each batch of consecutive sends and receives is
// posted at once, activations on one communicator and gradients on another (ctx.pp and
// ctx.pp_grad: p2p matches by order only, and the two flow in different orders), then waited.
// Overlapped (run_schedule_overlapped, for a schedule built with overlap_p2p): each send and
// receive is posted alone on its one-way channel (ctx.pp_channels) and never waited where it
// stands; a compute action waits for its own input only (on CUDA its stream waits, the host goes
// on), and sends complete in the background, all waited at the end. The tensors between stages
// have one shape, dtype and device known in advance (Megatron's tensor_shape: (S/CP [/TP with SP],
// micro-batch, hidden)), so receive buffers are allocated before their data arrives; every wait is
// bounded by the communicators' timeout, so a stage that never sends is named by the watchdog.
#include <functional>

#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"
#include "megatron/pipeline_parallel/schedule.h"

namespace megatron::pipeline_parallel {

struct StageFunctions {
  // Micro-batch `microbatch` through model chunk `chunk`. `input` is the activation received from
  // the previous virtual stage, undefined on virtual stage 0. Returns the output, which is sent to
  // the next virtual stage (ignored on the last).
  std::function<Tensor(int64_t microbatch, int64_t chunk, const Tensor& input)> forward;
  // Its backward. `output_grad` is received from the next virtual stage, undefined on the last.
  // Returns the gradient of the input, sent back (ignored on virtual stage 0).
  std::function<Tensor(int64_t microbatch, int64_t chunk, const Tensor& output_grad)> backward;
};

struct StageTensor {
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

// Executes `actions` (build_schedule for this rank) with `activations` and `grads` the pipeline
// group's two communicators (peer = pipeline rank). Throws when a compute function returns a tensor
// of another shape or dtype than `between_stages`.
void run_schedule(const std::vector<Action>& actions, Communicator& activations, Communicator& grads,
                  const StageTensor& between_stages, const StageFunctions& stage);

// The same with `channels` (built: PipelineChannels::built) for a schedule built with overlap_p2p.
void run_schedule_overlapped(const std::vector<Action>& actions, const PipelineChannels& channels,
                             const StageTensor& between_stages, const StageFunctions& stage);

}  // namespace megatron::pipeline_parallel
