// multirank-np: 2 4
// MoE under data parallelism equals the single rank: fp32 with the distributed optimizer,
// DeepSeek-style routing with an expert bias (its token counts are summed over DP once per step,
// so every rank moves it alike) and the aux loss (per micro-batch; micro-batches of one sequence,
// the same at every DP size).
//
// Tolerance 1e-6 relative on the loss and the gradient norm, as fp32 in test_dp_training.cpp: the
// layouts differ only in the order of the fp32 gradient sums (a few u = 2^-24), which AdamW carries
// into the loss at the same order. Routing decisions are discontinuous, but perturbations of ~1e-7
// relative are far from flipping a choice; a bias updated from one rank's counts alone, or an aux
// loss scaled by the wrong number of micro-batches, moves the curve by far more.
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

class MoETraining : public ::testing::Test {
 protected:
  void SetUp() override { st_ = make_state({}, 30); }
  ParallelState st_;
};

TEST_F(MoETraining, DataParallelMatchesTheSingleRankCurve) {
  const std::vector<std::string> moe = {"--disable-bias-linear",
                                        "--swiglu",
                                        "--num-experts",
                                        "4",
                                        "--moe-router-score-function",
                                        "sigmoid",
                                        "--moe-router-enable-expert-bias",
                                        "--moe-router-bias-update-rate",
                                        "0.05",
                                        "--moe-aux-loss-coeff",
                                        "1e-2",
                                        "--moe-grouped-gemm"};
  const TrainingSummary single = train_single_rank(with(tiny_run(20), moe));
  const TrainingSummary s = train_on(st_.ctx, with(with(tiny_run(20), moe), {"--use-distributed-optimizer"}));
  expect_same_curve(single, s, 0, 1e-6, true,
                    "MoE DP " + std::to_string(st_.ctx.world->size()) + " --use-distributed-optimizer");
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
