// multirank-np: 2 4
// Megatron FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy S) trains the single-rank
// model. In f64, DP = the world (2 or 4; 8 sequences per batch, so 4 or 2 micro-batches per rank,
// and each module's gradients are reduce-scattered once per micro-batch), 10 iterations with a
// validation at 10, dropout on: every strategy with GPT-2 style (tied embeddings: the word
// embedding is gathered again for the output layer and its bucket stays open through backward);
// optim_grads_params also under full recomputation (the rerun gathers its segment before the
// backward) and, LLaMA style (untied, SwiGLU, GQA), with --overlap-grad-reduce
// --overlap-param-gather. TP x DP is test_fsdp_tp_training.cpp; memory and checkpoints have
// tests of their own (test_fsdp_memory.cpp, test_fsdp_checkpoint.cpp).
//
// Tolerance 200 u relative (u = 2^-53), as the TP and PP tests: a layout sums the same terms in
// another order (the 1/DP-scaled reduce-scatter per micro-batch, then the accumulation into the
// shard; each regrouping moves a result by a few u). A defect (a gradient dropped, a stale gathered
// bucket, a shard added twice) moves the curve by 1e-3 or more. The margin used is printed.
#include <string>
#include <vector>

#include "multirank/fsdp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

TEST(FsdpTraining, EveryStrategyFollowsTheSingleRank) {
  const ParallelState st = make_state({}, 60);
  const int dp = st.ctx.world->size();
  const bool print = st.ctx.world->rank() == 0;
  const double tolerance = 200 * 0x1p-53;
  const TrainingSummary gpt = run_f64(ParallelContext::single_process(), fsdp_run(ModelStyle::gpt, kFsdpIterations));
  for (const char* strategy : {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    const std::vector<std::string> flags = fsdp_flags(strategy);
    const TrainingSummary s = run_f64(st.ctx, with(fsdp_run(ModelStyle::gpt, kFsdpIterations), flags));
    expect_same_run(gpt, s, tolerance, fsdp_run_name(ModelStyle::gpt, dp, flags), print);
  }
  const std::vector<std::string> recompute =
      with(fsdp_flags("optim_grads_params"),
           {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  expect_same_run(gpt, run_f64(st.ctx, with(fsdp_run(ModelStyle::gpt, kFsdpIterations), recompute)), tolerance,
                  fsdp_run_name(ModelStyle::gpt, dp, recompute), print);

  const TrainingSummary llama =
      run_f64(ParallelContext::single_process(), fsdp_run(ModelStyle::llama, kFsdpIterations));
  const std::vector<std::string> overlap =
      with(fsdp_flags("optim_grads_params"), {"--overlap-grad-reduce", "--overlap-param-gather"});
  expect_same_run(llama, run_f64(st.ctx, with(fsdp_run(ModelStyle::llama, kFsdpIterations), overlap)), tolerance,
                  fsdp_run_name(ModelStyle::llama, dp, overlap), print);
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
