#include "megatron/training/pipeline_step.h"

#include <map>

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

LossSums pipeline_forward_backward(GPTModel& model, const ParallelContext& ctx,
                                   const std::vector<MicroBatchRun>& microbatches, bool forward_only,
                                   const PipelineHooks& hooks) {
  const TransformerConfig& config = model.config();
  const int64_t rank = ctx.pp->rank();
  const pipeline_parallel::ScheduleShape shape{
      .pipeline_size = ctx.pp->size(), .microbatches = int64_t(microbatches.size()), .forward_only = forward_only};
  // Between stages: (S/TP under sequence parallelism, B, H) in the compute dtype.
  const int64_t micro_batch_size = microbatches.front().batch.tokens.dim(0);
  const int64_t sequence = config.seq_length / (ctx.sequence_parallel() ? ctx.tp_size() : 1);
  const pipeline_parallel::StageTensor between{.shape = {sequence, micro_batch_size, config.hidden_size},
                                               .dtype = config.params_dtype,
                                               .device = model.device()};

  std::map<int64_t, GPTModel::Saved> saved;  // by micro-batch, from its forward to its backward
  LossSums total;
  pipeline_parallel::StageFunctions stage;
  stage.forward = [&](int64_t m, int64_t, const Tensor& input) {
    const MicroBatchRun& run = microbatches[size_t(m)];
    LossSums loss;
    Tensor out = model.stage_forward(run.batch, input, run.fwd, saved[m], &loss);
    if (hooks.after_forward) hooks.after_forward(m);
    if (model.stage().loss) {
      if (hooks.on_loss) hooks.on_loss(m, loss);
      total.loss_sum += loss.loss_sum;
      total.num_tokens += loss.num_tokens;
    }
    if (forward_only) saved.erase(m);
    return out;
  };
  stage.backward = [&](int64_t m, int64_t, const Tensor& output_grad) {
    if (hooks.before_backward) hooks.before_backward(m);
    Tensor input_grad = model.stage_backward(output_grad, microbatches[size_t(m)].loss_grad_scale, saved.at(m));
    saved.erase(m);
    return input_grad;
  };
  pipeline_parallel::run_schedule(pipeline_parallel::build_schedule(shape, rank), *ctx.pp, *ctx.pp_grad, between,
                                  stage);
  return from_last_stage(ctx, total, model.device());
}

}  // namespace megatron
