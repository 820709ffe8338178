#pragma once
// FP8 parameters (--fp8-param-gather, Megatron's fp8_param_gather with the distributed optimizer):
// the weights of the FP8 layers are held as FP8 codes instead of in the compute dtype
// (Parameter::fp8), and the distributed optimizer casts each rank's shard of them from its f32
// masters after every update, so the parameter all-gather moves one byte an element for them and
// no bf16 copy of them exists: the layers' GEMMs take the codes as they are.
//
// A cast takes the scale the FP8 layer's own cast of the weight would take (Transformer Engine's
// cast_master_weights_to_fp8):
//   delayed:  the weight's scale of earlier steps (update_fp8_scales runs before the optimizer
//             step); the shard's amax goes into the weight's amax_history[0], which the layer
//             max-reduces over TP x DP x CP at the next update, as it would its forward cast's.
//             The scale being known before the update, AdamW casts in its own pass after a step
//             (ops::adamw_step_fp8, AdamWState::set_params' fp8_casts); cast_fp8_param_shards
//             casts at the start and after a checkpoint's load;
//   current (tensorwise): the scale of the whole (TP-local) weight's amax, the max of the shards'
//             over the data-parallel group, margin 0.
// The blockwise recipe is not built with FP8 parameters (validate_fp8 refuses it). The masters
// start from the compute-dtype values, not from their first cast (Transformer Engine's
// preserve_high_precision_init_val): a first cast at the delayed recipe's starting scale of 1
// would flush most of a small initialisation to zero.
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter.h"

namespace megatron {

// One rank's range of an FP8 parameter: its f32 masters and its codes (views of equal length).
struct Fp8ParamShard {
  const Parameter* param = nullptr;
  Tensor master, codes;
};

// Casts every shard into its codes. `fp8_params`: every FP8 parameter of the model (each rank of
// `group` passes the same ones in the same order, shard or not: the current recipe reduces their
// amaxes over `group`, the data-parallel group the shards split; null: each shard is a whole
// parameter). With record_amax off the
// delayed recipe records nothing: a checkpoint's weights cast again with the amax history it
// restored.
void cast_fp8_param_shards(const std::vector<Fp8ParamShard>& shards, const std::vector<const Parameter*>& fp8_params,
                           Communicator* group, bool record_amax = true);

// The values `codes` (a range of FP8 parameter `param`'s codes) stand for, codes x scale_inv in
// f32, in `dtype` on the host: masters rebuilt from the parameter, or a checkpoint's weights.
Tensor fp8_param_values(const Parameter& param, const Tensor& codes, DType dtype);

}  // namespace megatron
