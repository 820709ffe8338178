// multirank-np: 2 4
// Imported Hugging Face checkpoints (tests/hf/tiny/, every family) run through pipeline stages:
// PP = 2 on 2 ranks, TP 2 x PP 2 on 4. Each stage loads its layers by their global names from a
// checkpoint imported at PP = 1 and at the run's PP (the same files: checkpoints do not depend on
// the layout), the prompts pass through the stages as evaluation runs them (a forward-only
// schedule), and the last stage's logits match transformers' within the single-rank bound
// (hf/hf_test_util.h); Qwen3-MoE's, whose dense and sparse layers fall on different stages, the
// float64 oracle's.
#include <memory>

#include "hf/hf_test_util.h"
#include "hf/llama_family_oracle.h"
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
  const MicroBatch prompts{tokens, Tensor::zeros({P, T}, DType::i32), Tensor::zeros({P, T}, DType::f32), Tensor(),
                           Tensor()};
  GPTModel::Saved saved;
  StageFunctions functions;
  functions.forward = [&](int64_t, int64_t, const Tensor& input) {
    LossSums unused;
    return stage.stage_forward(prompts, input, {.training = false}, saved, &unused);
  };
  const ScheduleShape shape{.pipeline_size = ctx.pp->size(), .microbatches = 1, .forward_only = true};
  const int64_t sequence = T / (ctx.sequence_parallel() ? ctx.tp_size() : 1);  // each SP rank's share
  run_schedule(build_schedule(shape, ctx.pp->rank()), *ctx.pp, *ctx.pp_grad,
               {.shape = {sequence, P, stage.config().hidden_size}, .dtype = stage.config().params_dtype}, functions);
  return stage.stage().loss ? saved.logits : Tensor();
}

// The checkpoint of `hf` imported (as `name`) at PP 1 and at PP 2 and run at TP x PP 2 with `run_flags`:
// the last stage's logits match `ref` within the bound.
void expect_logits_at_pp2(const ParallelState& st, const std::string& dir, const std::string& name,
                          const std::string& hf, const HfReference& ref, const std::vector<std::string>& run_flags) {
  const int64_t world = st.ctx.world->size(), tp = world / 2;
  std::vector<std::string> flags = {"--tensor-model-parallel-size", std::to_string(tp),
                                    "--pipeline-model-parallel-size", "2"};
  flags.insert(flags.end(), run_flags.begin(), run_flags.end());
  for (int64_t import_pp : {1, 2}) {
    const std::string ckpt = dir + "/" + name + "-pp" + std::to_string(import_pp);
    if (st.ctx.world->rank() == 0)
      hf_bridge::import_hf({.hf_dir = hf, .save = ckpt, .pipeline_model_parallel_size = import_pp});
    st.ctx.world->barrier();
    // As `megatron train --load CKPT --finetune` at this layout would build and load its stage.
    const TrainingArgs args = parse_training_args(finetune_argv(ckpt, flags), world);
    const ParallelContext ctx = model_context(st.ctx, args.parallel);
    GPTModel stage(args.model, ctx, Device::cpu(),
                   pipeline_split(args.parallel, args.model.num_layers).stage(ctx.pp->rank(), 0));
    ASSERT_TRUE(load_training_checkpoint(args, stage, nullptr, nullptr, nullptr));
    const Tensor logits = pipeline_logits(stage, prompt_tokens(ref), ctx);
    if (!logits.defined()) continue;
    const double error = logit_error(logits, logits.dim(2) * ctx.tp_rank(), ref);
    std::printf("%s imported at PP %ld, run at TP %ld x PP 2 (TP rank %d): max |logit - reference| = %.3g\n",
                name.c_str(), long(import_pp), long(tp), ctx.tp_rank(), error);
    EXPECT_LE(error, kLogitTolerance) << name << " imported at PP " << import_pp;
  }
}

TEST(HfPipelineParallel, LogitsMatchTransformersAtPp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = make_state({}).ctx.world->size() / 2, .pp = 2}, 60);
  for (const char* family : kHfFamilies)
    expect_logits_at_pp2(st, dir, family, hf_fixture(family), hf_reference(family),
                         st.ctx.world->size() > 2 ? tp_run_flags(family) : std::vector<std::string>{});
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

// Qwen3-MoE (made from the Qwen2 fixture): its dense layer 0 on the first stage, its sparse layer 1
// on the last; the logits match the float64 oracle's (hf/llama_family_oracle.h). MoE under TP
// routes each rank's own tokens: sequence parallelism (Megatron's rule).
TEST(HfPipelineParallel, Qwen3MoeLogitsMatchTheOracleAtPp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = make_state({}).ctx.world->size() / 2, .pp = 2}, 60);
  const std::string hf = dir + "/qwen2-edited";  // where edited_fixture of qwen2 writes
  if (st.ctx.world->rank() == 0) {
    ASSERT_EQ(qwen3_moe_fixture(*owner, true), hf);
  }
  st.ctx.world->barrier();
  const HfReference ref = oracle_reference(LlamaFamilyOracle(hf), hf_reference("qwen2").input_ids);
  expect_logits_at_pp2(st, dir, "qwen3_moe", hf, ref,
                       st.ctx.world->size() > 2 ? tp_run_flags("qwen3_moe") : std::vector<std::string>{});
  st.ctx.world->barrier();
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
