#pragma once
// FP8 training, with Megatron's flags and Transformer Engine's recipes: plain data held by
// TransformerConfig::fp8; validate_fp8 reports every broken rule, nothing is rewritten.
//
//   --fp8-format e4m3|hybrid      on when given: e4m3 for every GEMM operand, or hybrid (e4m3 in
//                                 forward, e5m2 for the output gradient in backward)
//   --fp8-recipe delayed|tensorwise|blockwise   delayed: each operand's scale comes from an amax
//                                 history of --fp8-amax-history-len steps (max or most_recent of it,
//                                 --fp8-amax-compute-algo), scale = fp8_max / amax / 2^--fp8-margin,
//                                 updated after every step; tensorwise: current scaling, from this
//                                 tensor's own amax; blockwise: current scaling per 1x128 tile
//                                 (activations, gradients) or 128x128 block (weights), power-of-2
//                                 scales (Transformer Engine's Float8BlockScaling; ops/fp8.h).
//                                 mxfp8 and custom are Megatron's, not built here: refused.
//   --fp8-param-gather            the FP8 layers' weights held as FP8 codes, cast from the
//                                 distributed optimizer's masters and all-gathered in FP8
//                                 (distributed/fp8_params.h); delayed and tensorwise recipes.
//   --first-last-layers-bf16      the first --num-layers-at-start-in-bf16 and the last
//                                 --num-layers-at-end-in-bf16 layers keep their GEMMs in bf16.
// What runs in FP8: the four GEMMs of every (FP8) layer's attention and dense MLP (linear_qkv,
// linear_proj, linear_fc1, linear_fc2), forward and backward; the embedding, output layer, norms,
// attention core and MoE experts stay in bf16 (tensor_parallel/fp8_linear.h).
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/ops/fp8.h"

namespace megatron {

struct Fp8Config {
  std::string fp8_format;                             // "" (off), "e4m3" or "hybrid"
  std::string fp8_recipe = "delayed";                 // delayed | tensorwise | blockwise (Megatron's names)
  int64_t fp8_margin = 0;                             // delayed only
  int64_t fp8_amax_history_len = 1;                   // delayed only
  std::string fp8_amax_compute_algo = "most_recent";  // delayed only: most_recent | max
  bool fp8_param_gather = false;
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;

  bool enabled() const { return !fp8_format.empty(); }
  // Whether layer `layer_number` (global, 0-based) of `num_layers` runs its GEMMs in FP8.
  bool layer_in_fp8(int64_t layer_number, int64_t num_layers) const;
  // The scaling the layers' GEMM operands follow (ops/fp8.h); for a valid, enabled config.
  ops::Fp8Recipe recipe() const;
};

// Every rule the settings break, one message each (value, rule, fix). `num_layers` bounds the
// bf16 layers at the start and end.
std::vector<std::string> validate_fp8(const Fp8Config& fp8, int64_t num_layers);

}  // namespace megatron
