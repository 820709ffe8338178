#pragma once
// Which global transformer layers each (pipeline rank, model chunk) owns, by Megatron's rules
// (Megatron-Core's get_num_layers_to_build and get_transformer_layer_offset, arguments.py):
//   Virtual stage s = chunk·P + rank; stages hold consecutive layers in s order, so a stage's first
//   layer is the sum of the counts of the stages before it. Stage 0 also holds the embedding, the
//   last stage (P·V-1) the final norm, output layer and loss.
//   Even split: (L + embedding? + loss?) / P per rank, / V per chunk, where
//     --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split count the
//     embedding (loss) as one layer of stage 0 (the last stage), which then builds one fewer.
//   Uneven: --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers fix rank 0's
//     (rank P-1's) layers, the others share the rest equally; / V per chunk. Not combinable with
//     the account-for flags (Megatron's rule).
//   Layout: --pipeline-model-parallel-layout lists the virtual stages in order, separated by '|':
//     'E' embedding, 't' a transformer layer, 'L' the loss; "x*N" and "(...)*N" repeat, commas and
//     spaces are ignored; V = stages / P. Replaces the flags above.
//   V: --num-virtual-stages-per-pipeline-rank, or rank's layers (even split, accounted layers
//     included) / --num-layers-per-virtual-pipeline-stage; V = 1 means no interleaving.
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/parallel/parallel_args.h"

namespace megatron::pipeline_parallel {

// What one model chunk of one pipeline rank builds.
struct StageLayers {
  int64_t first_layer = 0;  // global index of its first transformer layer
  int64_t num_layers = 0;   // may be 0: the stage passes its input on
  bool embedding = false;   // word (and position) embedding: virtual stage 0
  bool loss = false;        // final norm, output layer, loss: the last virtual stage
  bool operator==(const StageLayers&) const = default;
};

struct PipelineSplit {
  int64_t pipeline_size = 1;              // P
  int64_t virtual_stages = 1;             // V
  std::vector<int64_t> layers_per_stage;  // by virtual stage chunk·P + rank

  StageLayers stage(int64_t rank, int64_t chunk) const;
};

// Every rule `args` breaks for a model of `num_layers` layers, one message each (the values, the
// rule, the fix).
std::vector<std::string> validate_pipeline_split(const ParallelArgs& args, int64_t num_layers);

// The split; throws the first error validate_pipeline_split reports.
PipelineSplit pipeline_split(const ParallelArgs& args, int64_t num_layers);

}  // namespace megatron::pipeline_parallel
