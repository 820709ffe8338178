// multirank-np: 2 4
// A checkpoint saved under expert tensor parallelism resumes at layouts without it: saved at TP=2 x
// EP=world/2 (sequence parallel; on 4 ranks EP=2 x TP=2 with the distributed optimizer, whose
// shards cut the TP-split experts anywhere) at iteration 5, each expert's fc1 rows split over TP
// in [gate; up] blocks and its fc2 columns; resumed at one rank and at EP=2 without TP (on 2 or
// 4 ranks), on the uninterrupted single-rank curve. Experts are stored by global index and their
// TP shards by global offsets, their optimizer state with them, so the layouts load each other's
// shards. The MoE model of test_moe_training.cpp in fp32; tolerance 200 u (u = 2^-24) relative,
// as its EP checkpoint test: the layouts differ in the order of fp32 sums only. A shard stored at
// the wrong rows or an optimizer moment of another expert moves the curve by 1e-3 or more.
#include <memory>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

std::vector<std::string> ep_flags(int ep) { return {"--expert-model-parallel-size", std::to_string(ep)}; }

TEST(MoETensorParallelCheckpoint, ResumesWithoutTensorParallelism) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-24;
  constexpr int64_t kIterations = 10;
  const std::vector<std::string> moe = moe_flags();
  const TrainingSummary straight = train_single_rank(with(tiny_run(kIterations), moe));
  std::unique_ptr<TempDir> owner;
  std::string dir;
  {
    const ParallelState st = make_state({.tp = 2, .ep = world / 2}, 60);
    if (st.ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
    dir = shared_directory(owner.get());
    std::vector<std::string> save =
        with(with(ep_flags(world / 2), moe_tp2_flags()), {"--save", dir + "/etp", "--save-interval", "5"});
    if (world == 4) save.push_back("--use-distributed-optimizer");
    const TrainingSummary first = train_on(st.ctx, with(with(tiny_run(5), moe), save));
    const std::vector<double> straight_5(straight.train_losses.begin(), straight.train_losses.begin() + 5);
    expect_close(straight_5, first.train_losses, 0, tolerance, "TP=2 x EP loss");
    st.ctx.world->barrier();
  }
  const TrainingSummary at_one = train_single_rank(with(with(tiny_run(kIterations), moe), {"--load", dir + "/etp"}));
  expect_same_curve(straight, at_one, 5, tolerance, true, "TP=2 x EP -> one rank");
  {
    const ParallelState st = make_state({.ep = 2}, 60);
    const TrainingSummary at_ep2 =
        train_on(st.ctx, with(with(with(tiny_run(kIterations), moe), ep_flags(2)), {"--load", dir + "/etp"}));
    expect_same_curve(straight, at_ep2, 5, tolerance, true, "TP=2 x EP -> EP=2");
  }
  make_state({}).ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
