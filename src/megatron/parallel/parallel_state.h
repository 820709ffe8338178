#pragma once
// Builds the process groups of Megatron's rank layout (rank_layout.h) as communicators: MPI for
// CPU ranks, NCCL for GPU ranks, SingleRankCommunicator for groups of one process. A process
// started without a launcher is a world of one and needs no MPI.
//
//   ProcessInfo p = process_info_from_env();
//   auto mpi = p.launched() ? std::make_shared<MpiRuntime>(p) : nullptr;   // once per process
//   Device device = ...;                        // GPU = mpi->process().local_rank
//   ParallelState st = initialize_parallel(sizes, {.device = device, .timeout_seconds = 60 * minutes, .mpi = mpi});
//   GPTModel model(config, st.ctx, device);
//
// Groups with the same members on every rank (dp and dp_cp when CP=1, tp and mp when PP=1, ...)
// share one communicator, named after all its roles ("dp/dp_cp"), so NCCL builds no duplicate;
// pp_grad alone has its own (the pipeline's gradients must not queue behind its activations).
// The embedding groups contain the first and last pipeline stages only: ctx.embedding and
// ctx.position_embedding are null on the other ranks. The pipeline channels (when asked) are
// two-rank communicators, one per neighbouring pair, kind and direction.
//
// Destroy the state (and every copy of its ctx) before the MpiRuntime; a ParallelState that is
// destroyed while an exception propagates aborts the job (launch.h).
#include <memory>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/launch.h"
#include "megatron/parallel/rank_layout.h"

namespace megatron {

class Watchdog;

struct ParallelOptions {
  Device device = Device::cpu();  // cuda:i: NCCL communicators on GPU i (the current device)
  double timeout_seconds = 600;   // --distributed-timeout-minutes x 60; fractions allowed
  bool tied_embeddings = true;    // the last stage joins the embedding group
  // Builds ctx.pp_channels at PP > 1 (comm.h: the one-way channels of overlapped pipeline p2p).
  bool pipeline_channels = false;
  size_t log_capacity = 64;  // collective-log records kept per rank
  // The process's MPI runtime; null for a single process without a launcher.
  std::shared_ptr<MpiRuntime> mpi;
};

struct ParallelState {
  ProcessInfo process;
  ParallelSizes sizes;  // world = the launched world size
  RankLayout layout;    // this rank's groups as global ranks
  Device device;
  // Declared before ctx so the communicators go first, then the watchdog, then MPI.
  std::shared_ptr<MpiRuntime> mpi;
  std::shared_ptr<Watchdog> watchdog;
  ParallelContext ctx;

  // Bounds every later wait; `seconds` = --distributed-timeout-minutes x 60.
  void set_timeout(double seconds) { ctx.set_timeout(seconds); }
};

// `sizes.world` must be 1 (filled in from the launch) or the launched world size. Throws with
// every broken rule of the sizes (validate in rank_layout.h).
ParallelState initialize_parallel(const ParallelSizes& sizes, const ParallelOptions& options = {});

}  // namespace megatron
