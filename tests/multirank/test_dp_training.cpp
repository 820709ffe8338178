// multirank-np: 2 4
// Data-parallel training equals single-rank training: every DP layout (plain, overlapped
// buckets, distributed optimizer, overlapped parameter gather; fp32, bf16 and fp16 with dynamic
// loss scaling) gives the DP=1 loss curve of the same global batches, and a checkpoint saved at
// DP=2 with the distributed optimizer resumes at the full world's DP size and at DP=1 on the same
// curve. --calculate-per-token-loss's micro-batches equal one micro-batch of the whole batch.
//
// Tolerances, relative to the single-rank value. fp32 runs compare the loss and the gradient norm
// (the norm catches what Adam hides: clipping and Adam's normalisation make gradients scaled by a
// constant, e.g. a missing 1/DP, invisible in the loss); bf16 runs compare the loss.
//   fp32: 1e-6. The layouts differ from the single rank only in the order of the fp32 gradient
//     sums (each element sums M x DP micro-batch terms, pre-scaled by 1/DP; another order changes
//     it by a few units of u = 2^-24 ~ 6e-8), and AdamW carries that relative perturbation into
//     the weights and the loss at the same order: measured below 1e-7 over these 20 iterations,
//     so 1e-6 keeps a 10x margin while a defect (an unreduced bucket, a misplaced shard, a wrong
//     scale) moves the loss or the norm by far more.
//   bf16: 1e-3, a quarter of bf16's unit roundoff 2^-8. The compute copy is the fp32 master
//     rounded to 8 significant bits; masters a few fp32 ulp apart round to neighbouring bf16
//     values when they straddle a rounding boundary, and training carries on from those weights,
//     so the loss may move by a fraction of bf16's resolution but not by a whole unit (measured:
//     6e-5). The DP code is the same for both dtypes; fp32 runs check it tightly and
//     test_ddp.cpp checks the bf16 distributed optimizer bit for bit.
//   fp16: 1.2e-4, a quarter of fp16's unit roundoff 2^-11, by the same argument as bf16. The loss
//     scale (2^12) is chosen not to overflow: where fp16 overflows depends on the DP size, in
//     Megatron as here, since each micro-batch's loss is divided by the number of micro-batches
//     per rank, so the fp16 activation gradients at DP=2 are twice those at DP=1 (the 1/DP comes
//     later, on the fp32 main grads). Measured: 7e-6. test_ddp.cpp checks that an overflow in one
//     rank's shard skips the step on every rank.
#include <mpi.h>

#include <filesystem>
#include <string>
#include <vector>

#include "megatron/parallel/mpi_communicator.h"
#include "megatron/training/arguments.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

enum class Precision { fp32, bf16, fp16 };

// Derivations in the header comment.
double tolerance(Precision p) { return p == Precision::bf16 ? 1e-3 : p == Precision::fp16 ? 1.2e-4 : 1e-6; }

Precision precision_of(const std::vector<std::string>& flags) {
  if (flags.empty()) return Precision::fp32;
  return flags.front() == "--bf16" ? Precision::bf16 : flags.front() == "--fp16" ? Precision::fp16 : Precision::fp32;
}

// fp16 with dynamic loss scaling that neither grows nor overflows within these 20 iterations.
const std::vector<std::string> kFp16 = {"--fp16", "--initial-loss-scale", "4096"};

// A world of the ranks sharing `color`: world, dp and dp_cp are one MPI communicator over them,
// every other group is this rank alone.
ParallelContext data_parallel_context(const ParallelState& st, int color) {
  MPI_Comm comm = MPI_COMM_NULL;
  EXPECT_EQ(MPI_Comm_split(MPI_COMM_WORLD, color, st.process.rank, &comm), MPI_SUCCESS);
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> members(static_cast<size_t>(size));
  MPI_Allgather(&st.process.rank, 1, MPI_INT, members.data(), 1, MPI_INT, comm);
  ParallelContext ctx = ParallelContext::single_process();
  ctx.world = ctx.dp = ctx.dp_cp = ctx.expert_dp = std::make_shared<MpiCommunicator>("dp", comm, members, st.watchdog);
  ctx.set_timeout(st.ctx.world->timeout());
  return ctx;
}

class DpTraining : public ::testing::Test {
 protected:
  void SetUp() override { st_ = make_state({}, 30); }
  ParallelState st_;
};

TEST_F(DpTraining, EveryLayoutMatchesTheSingleRankCurve) {
  const int dp = st_.ctx.world->size();
  const TrainingSummary fp32 = train_single_rank(tiny_run(20));
  const TrainingSummary bf16 = train_single_rank(with(tiny_run(20), {"--bf16"}));
  const TrainingSummary fp16 = train_single_rank(with(tiny_run(20), kFp16));
  ASSERT_EQ(fp32.train_losses.size(), 20u);
  ASSERT_EQ(fp32.valid_losses.size(), 2u);
  const std::vector<std::vector<std::string>> layouts = {
      {},
      {"--overlap-grad-reduce", "--ddp-bucket-size", "1000"},
      {"--use-distributed-optimizer"},
      {"--bf16", "--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000",
       "--overlap-param-gather"},
      with(kFp16, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000"}),
  };
  for (const auto& flags : layouts) {
    std::string name = "DP " + std::to_string(dp);
    for (const std::string& f : flags) name += " " + f;
    const Precision precision = precision_of(flags);
    const TrainingSummary s = train_on(st_.ctx, with(tiny_run(20), flags));
    const TrainingSummary& single = precision == Precision::bf16 ? bf16 : precision == Precision::fp16 ? fp16 : fp32;
    expect_same_curve(single, s, 0, tolerance(precision), precision == Precision::fp32, name);
    expect_close(single.valid_losses, s.valid_losses, 0, tolerance(precision), name + " validation loss");
    // After training: the validation split once more and the test split, each DP rank its slice.
    expect_close({single.end_valid_loss.value(), single.test_loss.value()},
                 {s.end_valid_loss.value(), s.test_loss.value()}, 0, tolerance(precision),
                 name + " validation and test loss after training");
  }
}

// Megatron's --calculate-per-token-loss: the gradient of the global batch's loss sum over its loss
// tokens. With --eod-mask-loss the micro-batches' token counts differ (a masked end of document),
// so that gradient is the one of a single micro-batch holding the whole batch, not the mean of the
// micro-batches' means. In f64 without dropout (its masks depend on the micro-batch shape): every
// rank's micro-batches of one sequence with the flag, on one rank and on the DP ranks, follow the
// single micro-batch of 8 within f64 rounding (1e-11, a few thousand u over 20 steps of sums of
// 16-128 terms); without the flag the curve parts from it by more (the control that the counts
// differ).
TEST_F(DpTraining, PerTokenLossIsOneMicroBatchOfTheWholeBatch) {
  std::vector<std::string> run = with(tiny_run(20), {"--eod-mask-loss"});
  for (size_t i = 0; i + 1 < run.size(); ++i)
    if (run[i] == "--hidden-dropout" || run[i] == "--attention-dropout") run[i + 1] = "0";
  std::vector<std::string> whole = run;
  for (size_t i = 0; i + 1 < whole.size(); ++i)
    if (whole[i] == "--micro-batch-size") whole[i + 1] = "8";
  const TrainingSummary reference = run_f64(ParallelContext::single_process(), whole);
  const bool print = st_.ctx.world->rank() == 0;
  const std::vector<std::string> per_token = with(run, {"--calculate-per-token-loss"});
  expect_same_curve(reference, run_f64(ParallelContext::single_process(), per_token), 0, 1e-11, true,
                    "one rank, 8 micro-batches, --calculate-per-token-loss");
  expect_same_curve(reference, run_f64(st_.ctx, per_token), 0, 1e-11, true,
                    "DP " + std::to_string(st_.ctx.world->size()) + ", --calculate-per-token-loss");
  const TrainingSummary means = run_f64(st_.ctx, run);
  double parted = 0;
  for (size_t i = 0; i < means.grad_norms.size(); ++i)
    parted = std::max(parted, std::abs(means.grad_norms[i] - reference.grad_norms[i]) / reference.grad_norms[i]);
  EXPECT_GT(parted, 1e-6) << "without the flag the micro-batches' means should part from the whole batch's mean";
  if (print) std::printf("per-token loss: the micro-batch means part from it by %.1e\n", parted);
}

// fp32 and bf16 (whose master weights are saved separately as fp32_param).
TEST_F(DpTraining, DistributedOptimizerCheckpointResumesAtAnotherDpSize) {
  Communicator& world = *st_.ctx.world;
  const int rank = world.rank();
  const std::unique_ptr<TempDir> owner = rank == 0 ? std::make_unique<TempDir>() : nullptr;
  const std::string dir = shared_directory(owner.get());
  for (const bool bf16 : {false, true}) {
    const std::vector<std::string> precision = bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{};
    const Precision p = bf16 ? Precision::bf16 : Precision::fp32;
    const std::string ckpt = dir + (bf16 ? "/bf16" : "/fp32");
    const TrainingSummary straight = train_single_rank(with(tiny_run(20), precision));
    {
      // Ranks 0 and 1 train 10 iterations at DP=2 and save; any others wait.
      const ParallelContext pair = data_parallel_context(st_, rank < 2 ? 0 : 1);
      if (rank < 2)
        train_on(pair, with(tiny_run(10),
                            with(precision, {"--use-distributed-optimizer", "--save", ckpt, "--save-interval", "10"})));
    }
    world.barrier();
    ASSERT_TRUE(std::filesystem::exists(ckpt + "/iter_0000010/metadata.json"));

    const std::string kind = bf16 ? " (bf16)" : " (fp32)";
    const TrainingSummary wide =
        train_on(st_.ctx, with(tiny_run(20), with(precision, {"--use-distributed-optimizer", "--load", ckpt})));
    expect_same_curve(straight, wide, 10, tolerance(p), p == Precision::fp32,
                      "DP 2 -> DP " + std::to_string(world.size()) + kind);
    const TrainingSummary single = train_single_rank(with(tiny_run(20), with(precision, {"--load", ckpt})));
    expect_same_curve(straight, single, 10, tolerance(p), p == Precision::fp32, "DP 2 -> DP 1" + kind);
  }
  world.barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
