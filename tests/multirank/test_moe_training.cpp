// multirank-np: 2 4
// MoE in `megatron train` under data and expert parallelism equals the single rank.
//
// DataParallelMatchesTheSingleRankCurve: fp32 with the distributed optimizer, DeepSeek-style
// routing with an expert bias (its token counts are summed over DP once per step, so every rank
// moves it alike) and the aux loss (per micro-batch; micro-batches of one sequence, the same at
// every DP size). Tolerance 1e-6 relative on the loss and the gradient norm, as fp32 in
// test_dp_training.cpp: the layouts differ only in the order of the fp32 gradient sums (a few
// u = 2^-24), which AdamW carries into the loss at the same order. Routing decisions are
// discontinuous, but perturbations of ~1e-7 relative are far from flipping a choice; a bias updated
// from one rank's counts alone, or an aux loss scaled by the wrong number of micro-batches, moves
// the curve by far more.
//
// ExpertParallelMatchesTheSingleRankCurve: the same model in f64, dropless, 10 iterations with a
// validation at 10: EP=2 (2 ranks; every EP rank its own data-parallel replica, expert DP 1), EP=4
// (4 ranks, one expert per rank), both with the allgather and the alltoall dispatcher, EP=2 x
// expert DP=2 with the distributed optimizer (4 ranks: expert gradients reduced and sharded over
// expert DP), and PP=2 x EP=2 (4 ranks: each stage's MoE layer exchanges tokens within its EP
// group, in the order 1F1B gives both EP ranks of the stage). Tolerance 200 u (u = 2^-53) relative, as
// the TP and PP tests: each layout sums the same f64 terms in another order (an expert's gradient
// over the EP group's tokens in rank order, the grad norm's expert squares summed over EP), each
// regrouping a few u. A token served by the wrong expert, an expert gradient scaled by EP, or
// experts counted once per EP rank in the norm moves the curve by 1e-3 or more.
//
// ExpertParallelCheckpointResumesAtAnotherEp: saved at EP=2 at iteration 5 (replicated optimizer on
// 2 ranks, where rank 1 is DP rank 1 but must save its own experts; EP=2 x DP=2 with the
// distributed optimizer on 4), resumed at EP=1 (one rank) and, on 4 ranks, at EP=4, on the
// uninterrupted single-rank curve within 200 u (u = 2^-24, fp32): experts are saved by global
// index, their optimizer state with them, so the layouts load each other's shards.
//
// PipelineCheckpointResumesAtOneRank: saved at PP=2 (x DP=2 on 4 ranks) at iteration 5, resumed on
// one rank on the same curve and tolerance: every stage's expert biases are in the checkpoint (the
// second stage's were lost while they travelled in the common state that world rank 0 writes).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

const std::vector<std::string> kMoE = moe_flags();

const std::vector<std::string> kAllToAll = {"--moe-token-dispatcher-type", "alltoall"};
const std::vector<std::string> kPp2AllToAll = {"--moe-token-dispatcher-type", "alltoall",
                                               "--pipeline-model-parallel-size", "2"};

int world_size() { return int(make_state({}).ctx.world->size()); }

std::vector<std::string> ep_flags(int ep) { return {"--expert-model-parallel-size", std::to_string(ep)}; }

TrainingSummary run(const ParallelContext& ctx, const std::vector<std::string>& argv, DType dtype) {
  TrainingArgs args = parse_training_args(argv, ctx.world->size());
  args.model.params_dtype = dtype;  // f64 has no flag: it exists for checks like this one
  return pretrain(args, ctx, Device::cpu());
}

TEST(MoETraining, DataParallelMatchesTheSingleRankCurve) {
  const ParallelState st = make_state({}, 30);
  const TrainingSummary single = train_single_rank(with(tiny_run(20), kMoE));
  const TrainingSummary s = train_on(st.ctx, with(with(tiny_run(20), kMoE), {"--use-distributed-optimizer"}));
  expect_same_curve(single, s, 0, 1e-6, true,
                    "MoE DP " + std::to_string(st.ctx.world->size()) + " --use-distributed-optimizer");
}

struct EpLayout {
  std::string name;
  int ep, pp;
  std::vector<std::string> flags;
};

std::vector<EpLayout> ep_layouts(int world) {
  if (world == 2) return {{"EP=2", 2, 1, {}}, {"EP=2 alltoall", 2, 1, kAllToAll}};
  return {{"EP=4", 4, 1, {}},
          {"EP=4 alltoall", 4, 1, kAllToAll},
          {"EP=2 x expert DP=2 distributed optimizer", 2, 1, {"--use-distributed-optimizer"}},
          {"PP=2 x EP=2 alltoall", 2, 2, kPp2AllToAll}};
}

TEST(MoETraining, ExpertParallelMatchesTheSingleRankCurve) {
  const int world = world_size();
  const double tolerance = 200 * 0x1p-53;
  constexpr int64_t kIterations = 10;
  // --log-params-norm: each EP rank's experts summed over the expert model-parallel group.
  const std::vector<std::string> moe_run = with(with(tiny_run(kIterations), kMoE), {"--log-params-norm"});
  const TrainingSummary single = run(ParallelContext::single_process(), moe_run, DType::f64);
  ASSERT_EQ(single.valid_losses.size(), 1u);
  ASSERT_EQ(single.params_norms.size(), 2u);
  for (const EpLayout& l : ep_layouts(world)) {
    ParallelSizes sizes;
    sizes.pp = l.pp;
    sizes.ep = l.ep;
    const ParallelState st = make_state(sizes, 60);
    const TrainingSummary s = run(st.ctx, with(with(moe_run, ep_flags(l.ep)), l.flags), DType::f64);
    double worst = expect_same_curve(single, s, 0, tolerance, /*compare_grad_norm=*/true, l.name);
    worst = std::max(worst, expect_close(single.valid_losses, s.valid_losses, 0, tolerance, l.name + " validation"));
    worst = std::max(worst, expect_close({*single.end_valid_loss}, {*s.end_valid_loss}, 0, tolerance,
                                         l.name + " final validation loss"));
    if (st.ctx.world->rank() == 0)
      std::printf("%s: largest deviation %.1f u of the 200 u allowed\n", l.name.c_str(), worst / 0x1p-53);
  }
}

constexpr double kCheckpointTolerance = 200 * 0x1p-24;
constexpr int64_t kCheckpointIterations = 10;

// The MoE model's uninterrupted single-rank curve, and a checkpoint of it at iteration 5 saved by
// the layout `sizes` (its flags `save_flags`) into `dir`, whose first 5 losses are on that curve.
TrainingSummary straight_and_saved(const ParallelSizes& sizes, const std::vector<std::string>& save_flags,
                                   const std::string& dir, const std::string& layout) {
  const TrainingSummary straight = train_single_rank(with(tiny_run(kCheckpointIterations), kMoE));
  const ParallelState st = make_state(sizes, 60);
  const TrainingSummary first =
      train_on(st.ctx, with(with(tiny_run(5), kMoE), with(save_flags, {"--save", dir, "--save-interval", "5"})));
  const std::vector<double> straight_5(straight.train_losses.begin(), straight.train_losses.begin() + 5);
  expect_close(straight_5, first.train_losses, 0, kCheckpointTolerance, layout + " loss");
  st.ctx.world->barrier();
  return straight;
}

TEST(MoETraining, ExpertParallelCheckpointResumesAtAnotherEp) {
  const int world = world_size();
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get()) + "/ep2";
  std::vector<std::string> save = ep_flags(2);
  if (world == 4) save.push_back("--use-distributed-optimizer");
  const TrainingSummary straight = straight_and_saved({.ep = 2}, save, dir, "EP=2");
  const std::vector<std::string> resume = with(with(tiny_run(kCheckpointIterations), kMoE), {"--load", dir});
  expect_same_curve(straight, train_single_rank(resume), 5, kCheckpointTolerance, true, "EP=2 -> EP=1");
  if (world == 4) {
    const ParallelState st = make_state({.ep = 4}, 60);
    expect_same_curve(straight, train_on(st.ctx, with(resume, ep_flags(4))), 5, kCheckpointTolerance, true,
                      "EP=2 -> EP=4");
  }
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

// --calculate-per-token-loss at PP = the world (2 or 4 stages of a 4-layer MoE model), f64: every
// stage scales its MoE aux loss by the global batch's loss-token count, which only the stages that
// read data count (the first and the last; PP=4's middle stages learn it from them), so the run
// follows the single rank's with the flag within f64 rounding; a middle stage's aux-loss gradient
// left unscaled moves the curve by far more.
TEST(MoETraining, PerTokenLossOverThePipelineFollowsTheSingleRank) {
  const int pp = world_size();
  const ParallelState st = make_state({.pp = pp}, 30);
  const std::vector<std::string> argv =
      with(with(tiny_pp_run(ModelStyle::gpt, 10), kMoE), {"--calculate-per-token-loss", "--eod-mask-loss"});
  const TrainingSummary single = run(ParallelContext::single_process(), argv, DType::f64);
  const TrainingSummary s = run(st.ctx, with(argv, {"--pipeline-model-parallel-size", std::to_string(pp)}), DType::f64);
  expect_same_curve(single, s, 0, 1e-10, true, "MoE PP=" + std::to_string(pp) + " --calculate-per-token-loss");
}

TEST(MoETraining, PipelineCheckpointResumesAtOneRank) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get()) + "/pp2";
  const TrainingSummary straight = straight_and_saved({.pp = 2}, {"--pipeline-model-parallel-size", "2"}, dir, "PP=2");
  const std::vector<std::string> resume = with(with(tiny_run(kCheckpointIterations), kMoE), {"--load", dir});
  expect_same_curve(straight, train_single_rank(resume), 5, kCheckpointTolerance, true, "PP=2 -> one rank");
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
