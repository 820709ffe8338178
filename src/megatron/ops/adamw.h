#pragma once
// AdamW with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW / Apex FusedAdam:
//   g  = grad * grad_scale                      (grad_scale folds in 1/loss_scale and clipping)
//   m  = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p  = p - lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p)
// master, grad, exp_avg, exp_avg_sq: same numel, f32 (or all f64). step t >= 1.
// model_param: the compute copy (bf16/f16/f32/f64) written from the updated master; may be undefined
// when the master *is* the model parameter.
// Or master u16: the masters' remainders beside bf16 model_param (core/param_remainder.h), the pair
// read as the f32 master and written back split; the same update, bit for bit, as an f32 master.
#include <cstdint>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t step = 1;
};

MEGATRON_OP(adamw_step, void(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                             Tensor& model_param, const AdamWParams& params));

// One piece of a multi-tensor step: elements [begin, begin + grad.numel()) of the flat master and
// moment buffers, updated from `grad` into `model_param` as adamw_step updates them, with its own
// weight decay.
struct AdamWPiece {
  int64_t begin = 0;
  Tensor grad, model_param;
  float weight_decay = 0.0f;
};
// adamw_step of every piece (params.weight_decay unused: each piece's own), the same bits as one
// adamw_step per piece. master: the flat f32 masters or u16 remainders, each piece's model_param
// then its compute copy (bf16 for remainders); or undefined, each piece's f32 model_param then
// its own master. On CUDA one launch covers many pieces of one compute-copy dtype (apex's
// multi_tensor_apply): no launch per small tensor (a norm's weight), no tail per large one.
MEGATRON_OP(adamw_step_pieces, void(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq,
                                    std::vector<AdamWPiece>& pieces, const AdamWParams& params));
// adamw_step of f32 masters whose compute copy is FP8 codes (--fp8-param-gather under the delayed
// recipe, whose scale is known before the update: distributed/fp8_params.h): codes (e4m3 or e5m2,
// the masters' numel) = the updated masters cast at codes_scale ((1) f32, read on the device) and
// codes_amax ((1) f32) = max(codes_amax, max |updated master|), the bytes and amax of fp8_quantize
// after adamw_step, from one pass.
MEGATRON_OP(adamw_step_fp8, void(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& codes,
                                 Tensor& codes_amax, const Tensor& codes_scale, const AdamWParams& params));

}  // namespace megatron::ops
