#pragma once
// Argument checks of LayerNorm / RMSNorm (ops/norm.h), shared by ops/cpu/norm.cpp and ops/cuda/norm.cu.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/norm.h"

namespace megatron::ops::checks {

struct NormBackend {
  TensorCheck device;
  // Rejects an x dtype the backend has no kernel for; called with the op's name, before the checks
  // that compare other tensors' dtypes with x's, so an unsupported x is reported as such.
  TensorCheck x_dtype;
};

// x viewed as (rows, channels).
struct NormDims {
  int64_t rows, channels;
};
NormDims check_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& weight, const Tensor& bias, const NormParams& params,
                            const NormBackend& backend);
// norm_forward_fp8: x, weight, bias and the statistics as norm_forward's (y undefined), the casts
// as checks::check_fp8_casts'.
NormDims check_norm_forward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& rstd,
                                const NormParams& params, const Tensor& scale, const NormBackend& backend);
NormDims check_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const NormParams& params, const NormBackend& backend);
// The norm's checks, plus residual and h like x.
NormDims check_add_norm_forward(const Tensor& h, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                const NormParams& params, const NormBackend& backend);
// The norm's backward checks with h as its input x, plus dh like h.
NormDims check_add_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                 const Tensor& dh, const Tensor& h, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const NormParams& params, const NormBackend& backend);

}  // namespace megatron::ops::checks
