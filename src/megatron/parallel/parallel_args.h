#pragma once
// The parallel layout a run asks for, with Megatron's flag names: the one place that holds the
// size of every parallel axis, sequence parallelism and TP communication overlap
// (TrainingArgs::parallel). The fields keep what the user gave; layers never read them but ask
// the ParallelContext built from them (comm.h), which applies Megatron's semantics (sequence
// parallelism and its overlap take effect only where TP > 1).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/rank_layout.h"

namespace megatron {

struct ParallelArgs {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;  // --context-parallel-size: each sequence split over CP ranks
  std::string cp_comm_type = "p2p";   // --cp-comm-type: p2p (the ring), a2a (all-to-all over heads), allgather,
                                      // a2a+p2p (all-to-all inside the hierarchical groups, ring across)
  std::vector<std::string> hierarchical_context_parallel_sizes{};  // --hierarchical-context-parallel-sizes, as given
  int64_t expert_model_parallel_size = 1;                          // EP: experts split over EP ranks of each DP group
  int64_t expert_tensor_parallel_size = 0;                         // 0: Megatron's default, the TP size
  bool sequence_parallel = false;                                  // --sequence-parallel
  bool tp_comm_overlap = false;  // --tp-comm-overlap: SP collectives as rings beside the GEMMs

  // How the layers split over pipeline stages and model chunks (pipeline_parallel/stage_split.h
  // applies Megatron's rules); unset = not given.
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage{};             // VP = layers per rank / this
  std::optional<int64_t> num_virtual_stages_per_pipeline_rank{};              // VP directly
  std::optional<int64_t> microbatch_group_size_per_virtual_pipeline_stage{};  // default: PP
  std::optional<int64_t> decoder_first_pipeline_num_layers{};                 // uneven first stage
  std::optional<int64_t> decoder_last_pipeline_num_layers{};                  // uneven last stage
  bool account_for_embedding_in_pipeline_split = false;                       // the embedding counts as a layer
  bool account_for_loss_in_pipeline_split = false;                            // the loss counts as a layer
  std::string pipeline_model_parallel_layout{};                               // e.g. "Et|(tt|)*3,L"; "" = none
  bool overlap_p2p_comm = true;  // --no-overlap-p2p-communication turns it off; kept only when interleaved

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
