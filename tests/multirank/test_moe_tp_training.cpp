// multirank-np: 2 4
// MoE in `megatron train` under tensor parallelism (expert TP = TP, Megatron's default, with
// sequence parallelism) equals the single rank: the MoE model of test_moe_training.cpp (DeepSeek-
// style sigmoid routing with an expert bias moved every step, the aux loss, the grouped GEMM,
// dropless, dropout on) in f64, 10 iterations with a validation at 10, on TP=2 alone (2 ranks)
// and on 4 ranks EP=2 x TP=2 and TP=2 x DP=2 with the distributed optimizer (expert DP 2), with
// the allgather and the alltoall dispatcher; and with --expert-tensor-parallel-size 1, TP=2 x EP=2
// (the TP ranks hold whole experts and exchange their sequence halves; on 4 ranks with the
// distributed optimizer over expert DP 2); and a gated shared expert. The TP layouts pad the
// vocabulary to the single rank's 128 rows (--make-vocab-size-divisible-by 32).
//
// Tolerance 200 u (u = 2^-53) relative, as the TP, PP and EP tests: each layout sums the same f64
// terms in another order (TP partial outputs, the router's gradient over the sequence shards,
// the routing counts over TP), each regrouping a few u. A TP shard of the wrong expert rows, a
// router gradient not summed over TP, an aux loss or expert-bias count of one sequence shard's
// tokens moves the curve by 1e-3 or more.
#include <cstdio>
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

struct TpLayout {
  std::string name;
  int ep, etp;  // etp 0: the TP size
  std::vector<std::string> flags;
};

std::vector<TpLayout> tp_layouts(int world) {
  const std::vector<std::string> alltoall = {"--moe-token-dispatcher-type", "alltoall"};
  const std::vector<std::string> etp1 = {"--expert-tensor-parallel-size", "1"};
  if (world == 2)
    return {{"TP=2", 1, 0, {}}, {"TP=2 alltoall", 1, 0, alltoall}, {"TP=2 x EP=2 x expert TP=1", 2, 1, etp1}};
  return {{"EP=2 x TP=2", 2, 0, {}},
          {"EP=2 x TP=2 alltoall", 2, 0, alltoall},
          {"TP=2 x DP=2 distributed optimizer", 1, 0, {"--use-distributed-optimizer"}},
          {"TP=2 x EP=2 x expert TP=1 alltoall distributed optimizer", 2, 1,
           with(with(etp1, alltoall), {"--use-distributed-optimizer"})}};
}

TEST(MoETensorParallelTraining, ExpertTensorParallelMatchesTheSingleRankCurve) {
  const int world = int(make_state({}).ctx.world->size());
  const double tolerance = 200 * 0x1p-53;
  constexpr int64_t kIterations = 10;
  const std::vector<std::string> run = with(tiny_run(kIterations), moe_flags());
  const TrainingSummary single = run_f64(ParallelContext::single_process(), run);
  ASSERT_EQ(single.valid_losses.size(), 1u);
  for (const TpLayout& l : tp_layouts(world)) {
    const ParallelState st = make_state({.tp = 2, .ep = l.ep, .etp = l.etp}, 60);
    const std::vector<std::string> layout = {"--expert-model-parallel-size", std::to_string(l.ep)};
    const TrainingSummary s = run_f64(st.ctx, with(with(with(run, moe_tp2_flags()), layout), l.flags));
    expect_same_run(single, s, tolerance, l.name, st.ctx.world->rank() == 0);
  }
}

// A shared expert gated per token (--moe-shared-expert-gate, Qwen2-MoE's): under sequence
// parallelism each TP rank's gate-weight gradient covers its own tokens and must be summed over TP
// (a gradient left unsummed, or summed where it is whole, moves the curve by far more than the
// bound). TP=2 on 2 ranks, EP=2 x TP=2 with the alltoall dispatcher on 4.
TEST(MoETensorParallelTraining, GatedSharedExpertMatchesTheSingleRankCurve) {
  const int world = int(make_state({}).ctx.world->size());
  const std::vector<std::string> run = with(
      with(tiny_run(10), moe_flags()), {"--moe-shared-expert-intermediate-size", "16", "--moe-shared-expert-gate"});
  const TrainingSummary single = run_f64(ParallelContext::single_process(), run);
  const int ep = world / 2;
  const ParallelState st = make_state({.tp = 2, .ep = ep}, 60);
  const std::vector<std::string> layout = {"--expert-model-parallel-size", std::to_string(ep),
                                           "--moe-token-dispatcher-type", "alltoall"};
  const TrainingSummary s = run_f64(st.ctx, with(with(run, moe_tp2_flags()), layout));
  expect_same_run(single, s, 200 * 0x1p-53, ep == 1 ? "TP=2 gated shared expert" : "EP=2 x TP=2 gated shared expert",
                  st.ctx.world->rank() == 0);
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
