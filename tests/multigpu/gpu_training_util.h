#pragma once
// Shared by the training tests on GPUs (test_multigpu_dp_training.cpp, test_multigpu_tp_training.cpp):
// `pretrain` on this rank's GPU, alone or on a context, and the line that reports how much of a
// tolerance a layout used (scripts/gpu-check.sh --multigpu copies every such line, found by
// "largest relative deviation", into its summary).
#include <mpi.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "multigpu/multigpu_util.h"
#include "multirank/dp_training_util.h"

namespace megatron::testing {

// The run alone on this rank's GPU: the reference every layout is compared with.
inline TrainingSummary train_single_gpu(const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, 1), ParallelContext::single_process(), local_gpu());
}

inline TrainingSummary train_on_gpus(const ParallelContext& ctx, const std::vector<std::string>& argv) {
  return pretrain(parse_training_args(argv, ctx.world->size()), ctx, local_gpu());
}

// A precision the training tests on GPUs run every layout in: its flags, the tolerance of the
// layout's curves against the single-GPU run of the same precision, and whether the gradient norm
// is compared besides the loss (and the validation losses).
struct Precision {
  std::string name;
  std::vector<std::string> flags;
  double tolerance;
  bool compare_grad_norm;
};

// bf16 parameters and activations over fp32 master weights and main grads: the loss within 1e-3,
// a quarter of bf16's unit roundoff 2^-8, as in the DP tests on CPU ranks. A layout sums in another
// order in fp32 (gradients over ranks, the vocab-parallel softmax terms) and, under TP, rounds
// more often in bf16 (each rank's row-parallel partial product is rounded before the sum over TP,
// as in Megatron); masters a few fp32 ulp apart round to neighbouring bf16 values, and training
// carries on from those weights, so the loss moves by a fraction of bf16's resolution but not by a
// unit. Measured on CPU ranks over these 20 iterations: DP 6e-5; TP=2 with SP 6.8e-5 (GPT), with
// --tp-comm-overlap 5.7e-5 (LLaMA); TP=4 6.4e-5; TP=2 x DP=2 with the distributed optimizer and
// overlap 6.3e-5. The GPU's reorderings (cuBLASLt's kernel per shard shape, NCCL's order, atomics)
// are of the same kind. The gradient norm is not compared: built from bf16 activation gradients,
// it moves by up to ~2e-3 between layouts, and the fp32 runs of the same layouts check it tightly.
inline Precision bf16_precision() { return {"bf16", {"--bf16"}, 1e-3, false}; }

// fp32 throughout: the loss and the gradient norm within 200 u (u = 2^-24) relative, as
// test_multigpu_tp_training.cpp derives it for layouts that regroup fp32 sums.
inline Precision fp32_precision() { return {"fp32", {}, 200 * 0x1p-24, true}; }

// The test-name suffix of a precision (INSTANTIATE_TEST_SUITE_P's name generator), and how gtest
// prints one.
inline std::string precision_name(const ::testing::TestParamInfo<Precision>& param) { return param.param.name; }
inline void PrintTo(const Precision& precision, std::ostream* os) { *os << precision.name; }

// The largest deviation over all ranks, printed by rank 0.
inline void report_deviation(double worst, const std::string& what, double tolerance) {
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf("%s: largest relative deviation from the single-GPU curve %.2e (tolerance %.1e)\n", what.c_str(), worst,
                tolerance);
}

}  // namespace megatron::testing
