#include "megatron/training/pipeline_step.h"

#include <map>
#include <utility>

#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_executor.h"

namespace megatron {

namespace {

// The last stage's sums on every stage of the pipeline.
LossSums from_last_stage(const ParallelContext& ctx, const LossSums& local, Device device) {
  if (ctx.pp->size() == 1) return local;
  Tensor host = Tensor::empty({2}, DType::f64);
  host.data<double>()[0] = local.loss_sum;
  host.data<double>()[1] = local.num_tokens;
  Tensor sums = host.to(device);
  ctx.pp->broadcast(sums, ctx.pp->size() - 1);
  return {sums.item(0), sums.item(1)};
}

}  // namespace

PipelineStepShape pipeline_step_shape(const TrainingArgs& args, bool forward_only) {
  return {.micro_batch_size = args.micro_batch_size,
          .microbatch_group_size = args.parallel.microbatch_group_size_per_virtual_pipeline_stage.value_or(0),
          .forward_only = forward_only,
          .overlap_p2p = args.pipeline_overlaps_p2p()};
}

bool stage_reads_data(const ModelChunks& model, bool document_masking) {
  return document_masking || model.has_embedding() || model.has_loss();
}

LossSums pipeline_forward_backward(ModelChunks& model, const ParallelContext& ctx,
                                   const std::vector<MicroBatchRun>& microbatches, const PipelineStepShape& shape,
                                   const PipelineHooks& hooks) {
  const TransformerConfig& config = model.config();
  const int64_t rank = ctx.pp->rank();
  const pipeline_parallel::ScheduleShape schedule{.pipeline_size = ctx.pp->size(),
                                                  .virtual_stages = model.size(),
                                                  .microbatches = int64_t(microbatches.size()),
                                                  .microbatch_group_size = shape.microbatch_group_size,
                                                  .forward_only = shape.forward_only,
                                                  .overlap_p2p = shape.overlap_p2p};
  // Between stages: (S/TP under sequence parallelism, B, H) in the compute dtype.
  const int64_t sequence = config.seq_length / (ctx.sequence_parallel() ? ctx.tp_size() : 1);
  const pipeline_parallel::StageTensor between{.shape = {sequence, shape.micro_batch_size, config.hidden_size},
                                               .dtype = config.params_dtype,
                                               .device = model.device()};

  // By (micro-batch, chunk), from its forward to its backward.
  std::map<std::pair<int64_t, int64_t>, GPTModel::Saved> saved;
  LossSums total;
  pipeline_parallel::StageFunctions stage;
  stage.forward = [&](int64_t m, int64_t c, const Tensor& input) {
    const MicroBatchRun& run = microbatches[size_t(m)];
    GPTModel& chunk = model.chunk(c);
    LossSums loss;
    if (hooks.before_forward) hooks.before_forward(m);
    Tensor out = chunk.stage_forward(run.batch, input, run.fwd, saved[{m, c}], &loss);
    if (hooks.after_forward) hooks.after_forward(m, chunk);
    if (chunk.stage().loss) {
      if (hooks.on_loss) hooks.on_loss(m, loss);
      total.loss_sum += loss.loss_sum;
      total.num_tokens += loss.num_tokens;
    }
    if (shape.forward_only) saved.erase({m, c});
    return out;
  };
  stage.backward = [&](int64_t m, int64_t c, const Tensor& output_grad) {
    if (hooks.before_backward) hooks.before_backward(m);
    Tensor input_grad =
        model.chunk(c).stage_backward(output_grad, microbatches[size_t(m)].loss_grad_scale, saved.at({m, c}));
    if (hooks.after_backward) hooks.after_backward(m);
    saved.erase({m, c});
    return input_grad;
  };
  const std::vector<pipeline_parallel::Action> actions = pipeline_parallel::build_schedule(schedule, rank);
  if (shape.overlap_p2p)
    pipeline_parallel::run_schedule_overlapped(actions, ctx.pp_channels, between, stage);
  else
    pipeline_parallel::run_schedule(actions, *ctx.pp, *ctx.pp_grad, between, stage);
  return from_last_stage(ctx, total, model.device());
}

}  // namespace megatron
