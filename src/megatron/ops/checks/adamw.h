#pragma once
// Argument checks of AdamW (ops/adamw.h), shared by ops/cpu/adamw.cpp and ops/cuda/adamw.cu.
#include "megatron/ops/adamw.h"
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

struct AdamWBackend {
  TensorCheck device;
  // Rejects a master dtype the backend has no kernel for (f32 and u16 remainders everywhere, f64
  // on the CPU).
  TensorCheck master_dtype;
  // Rejects a compute copy's dtype the backend does not write from the masters (FP8 codes are
  // rejected before it: they are adamw_step_fp8's).
  TensorCheck copy_dtype;
};

// step >= 1, betas in [0, 1).
void check_adamw_params(const AdamWParams& params);
// master f32/f64 (the backend's) or u16 remainders beside a bf16 model_param; exp_avg, exp_avg_sq
// and grad of master's numel and dtype (f32 beside remainders); model_param undefined or of
// master's numel in a dtype the backend writes.
void check_adamw_step(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                      const Tensor& model_param, const AdamWParams& params, const AdamWBackend& backend);
// Each piece inside the state and, with its slices of master, exp_avg and exp_avg_sq (or its
// model_param as its own master when master is undefined), as check_adamw_step's; every piece has
// a model_param.
void check_adamw_step_pieces(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const std::vector<AdamWPiece>& pieces, const AdamWParams& params,
                             const AdamWBackend& backend);
// check_adamw_step's with f32 masters and no copy; codes FP8 of the masters' numel, codes_amax and
// codes_scale (1) f32.
void check_adamw_step_fp8(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                          const Tensor& codes, const Tensor& codes_amax, const Tensor& codes_scale,
                          const AdamWParams& params, const AdamWBackend& backend);

}  // namespace megatron::ops::checks
