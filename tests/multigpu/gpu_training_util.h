#pragma once
// Shared by the training tests on GPUs (test_multigpu_dp_training.cpp, test_multigpu_tp_training.cpp):
// `pretrain` on this rank's GPU, alone or on a context, and the line that reports how much of a
// tolerance a layout used (scripts/gpu-check.sh --multigpu copies every such line, found by
// "largest relative deviation", into its summary).
#include <mpi.h>

#include <cstdio>
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
