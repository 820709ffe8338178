#pragma once
// What a checkpoint holds of FP8 training: the delayed recipe's state of every FP8 linear layer
// (tensor_parallel/fp8_linear.h, Fp8Linear::RecipeState), so that a resumed run casts with the
// scales and amax histories the uninterrupted run would have. Four f32 tensors per layer, named
// after Transformer Engine's _extra_state (which Megatron saves per TE module as one pickled
// blob; its fields here are tensors of our format):
//   <layer>._extra_state.scale_fwd          (2)     input, weight
//   <layer>._extra_state.amax_history_fwd   (L, 2)  L = --fp8-amax-history-len
//   <layer>._extra_state.scale_bwd          (1)     output gradient
//   <layer>._extra_state.amax_history_bwd   (L, 1)
// <layer> is the module path, e.g. decoder.layers.3.self_attention.linear_qkv. Current scaling
// (--fp8-recipe tensorwise) carries nothing from step to step and saves nothing, as TE.
//
// Save: every rank of a layer's TP x DP x CP group holds the same state (the amaxes are
// max-reduced over that group before each update), so it is saved once per layer, by TP rank 0
// and DP x CP rank 0 of the pipeline stage holding it, as a whole tensor; any layout loads it.
// The current step's slot (history row 0) is reduced the same way first: casts since the last
// update (an evaluation's forwards) recorded only this rank's amaxes there.
// Load (every rank, for the layers it holds; --finetune too, as Megatron loads _extra_state with
// the weights):
//   - a delayed-FP8 layer whose state the checkpoint holds takes it; a history of another length
//     is cut or extended as TE's adjust_amax_history_length does, with a warning naming both;
//   - one whose state the checkpoint lacks (saved in bf16, under tensorwise, or with the layer in
//     bf16) starts afresh, scale 1 and an empty history, as TE's set_extra_state does with the
//     empty state of a module saved without FP8; the log says so;
//   - state the checkpoint holds for a layer this rank runs without delayed FP8 (bf16, tensorwise)
//     is not loaded, as Megatron leaves it unused; the log says so.
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/optimizer/optimizer.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/tensor_parallel/fp8_linear.h"
#include "megatron/transformer/fp8_config.h"

namespace megatron {

// The shards this rank writes of the delayed-FP8 layers among `layers`: one replica per layer over
// the world (one_replica: a collective over each layer's amax groups, every rank calls it), or
// every layer this rank holds (this_rank: no collective).
std::vector<checkpointing::ShardedTensor> fp8_recipe_state(const std::vector<tensor_parallel::Fp8Linear*>& layers,
                                                           Optimizer::StateCopies copies, const ParallelContext& ctx);

// Loads the state of `layers` (this rank's FP8 linear layers, built from `fp8`) from `reader`, onto
// `device`, by the rules above. `registry`: this rank's parameters, which tell the layers it holds
// (<layer>.weight) whose saved state it leaves unused.
void load_fp8_recipe_state(const checkpointing::CheckpointReader& reader,
                           const std::vector<tensor_parallel::Fp8Linear*>& layers, const Fp8Config& fp8,
                           const ParameterRegistry& registry, Device device);

}  // namespace megatron
