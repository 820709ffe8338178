#pragma once
// The parallel layout a run asks for, with Megatron's flag names: the one place that holds the
// size of every parallel axis, sequence parallelism and TP communication overlap
// (TrainingArgs::parallel). The fields keep what the user gave; layers never read them but ask
// the ParallelContext built from them (comm.h), which applies Megatron's semantics (sequence
// parallelism and its overlap take effect only where TP > 1).
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/rank_layout.h"

namespace megatron {

struct ParallelArgs {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;  // 1 in this build
  int64_t context_parallel_size = 1;         // 1 in this build
  int64_t expert_model_parallel_size = 1;    // 1 in this build
  int64_t expert_tensor_parallel_size = 0;   // 0: Megatron's default, the TP size; = TP in this build
  bool sequence_parallel = false;            // --sequence-parallel
  bool tp_comm_overlap = false;              // --tp-comm-overlap: SP collectives as rings beside the GEMMs

  // The sizes the ranks are laid out by (rank_layout.h); `world` is left for the launch to fill in.
  ParallelSizes sizes() const;
};

// Every rule the layout breaks on `world_size` ranks, one message each (value, rule, fix).
std::vector<std::string> validate(const ParallelArgs& args, int64_t world_size);

// The context a run's layers read: `groups` (built by initialize_parallel from args.sizes()) with
// the run's sequence parallelism and TP communication overlap. Warns, as Megatron does, where they
// take no effect (TP 1).
ParallelContext model_context(const ParallelContext& groups, const ParallelArgs& args);

}  // namespace megatron
