// multirank-np: 2 4
// Imported Hugging Face checkpoints (tests/hf/tiny/, every family) run through pipeline stages:
// PP = 2 on 2 ranks, TP 2 x PP 2 on 4. Each stage loads its layers by their global names from a
// checkpoint imported at PP = 1 and at the run's PP (the same files: checkpoints do not depend on
// the layout), the prompts pass through the stages as evaluation runs them (a forward-only
// schedule), and the last stage's logits match transformers' within the single-rank bound
// (hf/hf_test_util.h).
#include <memory>

#include "hf/hf_test_util.h"
#include "megatron/hf_bridge/convert.h"
#include "megatron/pipeline_parallel/schedule_executor.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

using namespace pipeline_parallel;

// The prompts through this rank's stage: the last stage returns its logits (T,P,V_local), the
// others undefined.
Tensor pipeline_logits(GPTModel& stage, const Tensor& tokens, const ParallelContext& ctx) {
  const int64_t P = tokens.dim(0), T = tokens.dim(1);
  const MicroBatch prompts{
      tokens, Tensor::zeros({P, T}, DType::i32), Tensor::zeros({P, T}, DType::f32), Tensor(), Tensor()};
  GPTModel::Saved saved;
  StageFunctions functions;
  functions.forward = [&](int64_t, int64_t, const Tensor& input) {
    LossSums unused;
    return stage.stage_forward(prompts, input, {.training = false}, saved, &unused);
  };
  const ScheduleShape shape{.pipeline_size = ctx.pp->size(), .microbatches = 1, .forward_only = true};
  run_schedule(build_schedule(shape, ctx.pp->rank()), *ctx.pp, *ctx.pp_grad,
               {.shape = {T, P, stage.config().hidden_size}, .dtype = stage.config().params_dtype}, functions);
  return stage.stage().loss ? saved.logits : Tensor();
}

TEST(HfPipelineParallel, LogitsMatchTransformersAtPp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const int64_t world = make_state({}).ctx.world->size(), tp = world / 2;
  const ParallelState st = make_state({.tp = tp, .pp = 2}, 60);
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", std::to_string(tp),
                                           "--pipeline-model-parallel-size", "2"};
  for (const char* family : kHfFamilies) {
    for (int64_t import_pp : {1, 2}) {
      const std::string ckpt = dir + "/" + family + "-pp" + std::to_string(import_pp);
      if (st.ctx.world->rank() == 0)
        hf_bridge::import_hf({.hf_dir = hf_fixture(family), .save = ckpt, .pipeline_model_parallel_size = import_pp});
      st.ctx.world->barrier();
      // As `megatron train --load CKPT --finetune` at this layout would build and load its stage.
      const TrainingArgs args = parse_training_args(finetune_argv(ckpt, layout), world);
      const ParallelContext ctx = model_context(st.ctx, args.parallel);
      GPTModel stage(args.model, ctx, Device::cpu(),
                     pipeline_split(args.parallel, args.model.num_layers).stage(ctx.pp->rank(), 0));
      ASSERT_TRUE(load_training_checkpoint(args, stage, nullptr, nullptr, nullptr));
      const HfReference ref = hf_reference(family);
      const Tensor logits = pipeline_logits(stage, prompt_tokens(ref), ctx);
      if (!logits.defined()) continue;
      const double error = logit_error(logits, logits.dim(2) * ctx.tp_rank(), ref);
      std::printf("%s imported at PP %ld, run at TP %ld x PP 2 (TP rank %d): max |logit - transformers| = %.3g\n",
                  family, long(import_pp), long(tp), ctx.tp_rank(), error);
      EXPECT_LE(error, kLogitTolerance) << family << " imported at PP " << import_pp;
    }
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
