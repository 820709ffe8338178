#pragma once
// Softmax cross-entropy over the vocabulary.
//   forward:  losses (N) f32 = lse_i - logits[i, target_i]   (per token, no mask applied)
//             lse (N) f32 saved for backward. logits (N,V) f32/bf16/f16/f64 (f64 -> f64 losses, lse).
//   backward: dlogits (N,V) = (softmax(logits) - onehot(target)) * loss_mask[i] * grad_scale
//             loss_mask (N) f32 may be undefined (all ones). dlogits may alias logits, so no
//             second full-vocabulary copy is needed.
// Targets are i32 in [0, V); an out-of-range target is an error on the CPU.
#include "megatron/core/tensor.h"

namespace megatron::ops {

void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets);
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale);

namespace cpu {
void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets);
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets);
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale);
}  // namespace cuda

}  // namespace megatron::ops
