#pragma once
// LayerNorm and RMSNorm over the last dimension C of x (N,C).
//   LayerNorm: y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), var biased.
//   RMSNorm:   y = x * rstd * w,               rstd = 1/sqrt(mean(x^2) + eps).
// Saved for backward: mean (N) (LayerNorm only; undefined for RMSNorm) and rstd (N), in f32
// (f64 for f64 x). bias is undefined for RMSNorm or LayerNorm without bias.
// Backward overwrites dx and accumulates dw, db. Outputs may not alias inputs.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

enum class NormKind { layernorm, rmsnorm };

struct NormParams {
  NormKind kind = NormKind::layernorm;
  float eps = 1e-5f;
};

// y undefined: only the statistics (mean, rstd), for norm_forward_fp8 to normalise from.
MEGATRON_OP(norm_forward, void(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                               const Tensor& bias, const NormParams& params));
// norm_forward's y from the statistics it computed (mean, rstd of x; for add_norm_forward x is its
// h), cast to FP8 for the next GEMM (Transformer Engine's LayerNorm-fused cast): the bytes of y in
// x's dtype followed by ops::fp8_quantize_transpose(q, q_t, amax, y, scale), without y ever stored;
// q, q_t, amax and scale as ops::swiglu_forward_fp8's.
MEGATRON_OP(norm_forward_fp8,
            void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Tensor& mean, const Tensor& rstd, const NormParams& params, const Tensor& scale));
MEGATRON_OP(norm_backward,
            void(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x, const Tensor& weight,
                 const Tensor& mean, const Tensor& rstd, const NormParams& params));

// Fused residual add + norm (Megatron/TE's fused add + LayerNorm/RMSNorm), for pre-norm layers:
//   add_norm_forward:  h = x + residual (rounded to x's dtype and written: the stream's next
//                      residual), y = norm(h); one pass instead of an add and a norm (y undefined:
//                      h and the statistics only).
MEGATRON_OP(add_norm_forward,
            void(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& residual,
                 const Tensor& weight, const Tensor& bias, const NormParams& params));
//   add_norm_backward: dx = dnorm/dh (dy) + dh, the gradient of h = x + residual (the same for x
//                      and residual): the norm's input gradient plus dh, the gradient that reached
//                      h along the residual stream, summed in float and rounded once. It is also
//                      the backward of a plain norm_forward whose input continues along the stream.
//                      h is the norm's input (x of norm_backward).
MEGATRON_OP(add_norm_backward,
            void(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& dh, const Tensor& h,
                 const Tensor& weight, const Tensor& mean, const Tensor& rstd, const NormParams& params));

}  // namespace megatron::ops
