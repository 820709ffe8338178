// multirank-np: 2 4
// Expert parallelism on GPUs (NCCL) trains the single-GPU model: the MoE model of the CPU-rank
// tests (multirank/dp_training_util.h: tiny_run with moe_flags(), dropout on, fp32 parameters),
// `pretrain` in every layout of the world (2 ranks: EP=2 with the allgather and the alltoall
// dispatcher; 4 ranks: EP=4 with both dispatchers, and EP=2 x expert DP=2 with the alltoall
// dispatcher, the distributed optimizer, overlapped gradient reduction and parameter gather, as
// bench/bench_ep.sh runs it; expert TP = TP with sequence parallelism: TP=2 alone on 2 ranks,
// EP=2 x TP=2 with both dispatchers on 4, the vocabulary padded to the single GPU's 128 rows; and
// TP=2 x EP=2 with --expert-tensor-parallel-size 1 and the alltoall dispatcher on 4) gives the loss and gradient-norm curve of 20 iterations, and the
// validation losses, of a single-GPU run of the same global batches computed by every rank on its
// own GPU. The alltoall layouts run Communicator::all_to_all_v on NCCL with the split sizes of
// each step's routing.
//
// Tolerance 200 u (u = 2^-24) relative in fp32, as the TP tests on GPUs (test_multigpu_tp_training.cpp
// derives it): the layouts differ from the single GPU in the order of fp32 sums (an expert's
// gradient over the EP group's tokens, the allgather dispatcher's reduce-scatter of partial
// outputs, NCCL's order, cuBLASLt's kernel per shape); on CPU ranks, in f64, the same layouts
// deviate by 11-14 u. Routing choices are discontinuous, but perturbations of a few u are far from
// flipping one; a token sent to the wrong rank or an expert gradient scaled by EP moves the curve
// by 1e-3 or more. The largest deviation seen is printed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "multigpu/gpu_training_util.h"

namespace megatron::testing {
namespace {

constexpr double kTolerance = 200 * 0x1p-24;
constexpr int kIterations = 20;

struct Layout {
  std::string name;
  int ep, tp;
  std::vector<std::string> flags;
  int etp = 0;  // 0: the TP size
};

std::vector<Layout> layouts_of_world(int world) {
  const std::vector<std::string> alltoall = {"--moe-token-dispatcher-type", "alltoall"};
  const std::vector<std::string> tp2 = moe_tp2_flags();
  if (world == 2)
    return {{"EP=2 allgather", 2, 1, {}}, {"EP=2 alltoall", 2, 1, alltoall}, {"TP=2 alltoall", 1, 2, with(tp2, alltoall)}};
  return {{"EP=4 allgather", 4, 1, {}},
          {"EP=4 alltoall", 4, 1, alltoall},
          {"EP=2 x expert DP=2 alltoall dist-opt overlap", 2, 1,
           with(alltoall, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000",
                           "--overlap-param-gather"})},
          {"EP=2 x TP=2 allgather", 2, 2, tp2},
          {"EP=2 x TP=2 alltoall", 2, 2, with(tp2, alltoall)},
          {"TP=2 x EP=2 x expert TP=1 alltoall", 2, 2,
           with(with(tp2, alltoall), {"--expert-tensor-parallel-size", "1"}), 1}};
}

TEST(GpuEpTraining, EveryLayoutMatchesTheSingleGpuCurve) {
  if (const std::string why = multigpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  cuda::init_device(local_gpu().index);  // the single-GPU run comes before any make_gpu_state
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::vector<std::string> run = with(tiny_run(kIterations, "cuda"), moe_flags());
  const TrainingSummary single = train_single_gpu(run);
  ASSERT_EQ(single.train_losses.size(), size_t(kIterations));
  for (const Layout& l : layouts_of_world(world)) {
    const ParallelState st = make_gpu_state({.tp = l.tp, .ep = l.ep, .etp = l.etp}, 120);
    const TrainingSummary s =
        train_on_gpus(st.ctx, with(with(run, {"--expert-model-parallel-size", std::to_string(l.ep)}), l.flags));
    const std::string name = l.name + " on GPUs fp32";
    double worst = expect_same_curve(single, s, 0, kTolerance, /*compare_grad_norm=*/true, name);
    worst = std::max(worst, expect_close(single.valid_losses, s.valid_losses, 0, kTolerance, name + " validation"));
    report_deviation(worst, name, kTolerance);
    st.ctx.world->barrier();  // every rank done with this layout's communicators before they go
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
