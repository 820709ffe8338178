#pragma once
// Helpers of the multi-GPU tests (ctest label multigpu, a machine with several GPUs): the
// multi-rank harness of multirank_util.h with one GPU per rank (GPU = local rank) and the NCCL
// communicators initialize_parallel builds on it. A job with fewer GPUs than ranks, or not
// launched under mpirun, skips every test with the reason.
#include <string>

#include "megatron/core/strings.h"
#include "megatron/cuda_runtime/device.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {

// Why this job cannot run the multi-GPU tests, or "" when it can. The same answer on every rank
// of a single-node job, so all ranks skip together.
inline std::string multigpu_unavailable() {
  const std::shared_ptr<MpiRuntime>& mpi = mpi_runtime();
  if (!mpi) return "not launched under mpirun: the multigpu tests run one process per GPU (ctest -L multigpu)";
  const int ranks = mpi->process().world_size, gpus = cuda::device_count();
  if (gpus < ranks)
    return concat(ranks, " ranks but ", gpus, " GPU(s) visible: the multigpu tests need one GPU per rank");
  return "";
}

// This rank's GPU.
inline Device local_gpu() { return Device::cuda(mpi_runtime()->process().local_rank); }

// The job's parallel state with NCCL communicators on this rank's GPU, which it makes current; the
// pipeline channels too, so interleaved runs overlap their p2p as Megatron's default has them.
inline ParallelState make_gpu_state(ParallelSizes sizes = {}, double timeout_seconds = 60) {
  cuda::init_device(local_gpu().index);
  ParallelOptions options;
  options.device = local_gpu();
  options.timeout_seconds = timeout_seconds;
  options.pipeline_channels = true;
  options.mpi = mpi_runtime();
  return initialize_parallel(sizes, options);
}

}  // namespace megatron::testing
