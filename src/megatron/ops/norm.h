#pragma once
// LayerNorm and RMSNorm over the last dimension C of x (N,C).
//   LayerNorm: y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps), var biased.
//   RMSNorm:   y = x * rstd * w,               rstd = 1/sqrt(mean(x^2) + eps).
// Saved for backward: mean (N) (LayerNorm only; undefined for RMSNorm) and rstd (N), in f32
// (f64 for f64 x). bias is undefined for RMSNorm or LayerNorm without bias.
// Backward overwrites dx and accumulates dw, db.
#include "megatron/core/tensor.h"

namespace megatron::ops {

enum class NormKind { layernorm, rmsnorm };

struct NormParams {
  NormKind kind = NormKind::layernorm;
  float eps = 1e-5f;
};

void norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const NormParams& params);
void norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const NormParams& params);

namespace cpu {
void norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const NormParams& params);
void norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const NormParams& params);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const NormParams& params);
void norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const NormParams& params);
}  // namespace cuda

}  // namespace megatron::ops
