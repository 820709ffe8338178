// multirank-np: 4
// Megatron FSDP composed with tensor parallelism: TP=2 x DP=2, each TP rank's buffers sharded over
// its DP group, on the single-rank f64 curve (test_fsdp_training.cpp's runs and tolerance, 200 u):
// GPT-2 style with optim_grads_params and sequence parallelism (the norms' and biases' gradients
// summed over TP on the owned ranges of the shards), LLaMA style with optim_grads_params without
// SP and with optim_grads with SP.
#include <string>
#include <vector>

#include "multirank/fsdp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

TEST(FsdpTraining, TensorTimesDataParallelFollowsTheSingleRank) {
  const ParallelState st = make_state({.tp = 2}, 60);
  const bool print = st.ctx.world->rank() == 0;
  struct Run {
    ModelStyle style;
    const char* strategy;
    bool sequence_parallel;
  };
  for (const Run& run :
       {Run{ModelStyle::gpt, "optim_grads_params", true}, Run{ModelStyle::llama, "optim_grads_params", false},
        Run{ModelStyle::llama, "optim_grads", true}}) {
    const TrainingSummary single = run_f64(ParallelContext::single_process(), fsdp_run(run.style, kFsdpIterations));
    std::vector<std::string> flags = with(fsdp_flags(run.strategy), {"--tensor-model-parallel-size", "2"});
    if (run.sequence_parallel) flags.push_back("--sequence-parallel");
    const TrainingSummary s = run_f64(st.ctx, with(fsdp_run(run.style, kFsdpIterations), flags));
    expect_same_run(single, s, 200 * 0x1p-53, "TP 2 x " + fsdp_run_name(run.style, 2, flags), print);
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
