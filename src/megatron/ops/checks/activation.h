#pragma once
// Argument checks of the activation family (ops/activation.h), shared by ops/cpu/activation.cpp and
// ops/cuda/activation.cu; `device` is the backend's device rule.
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

void check_gelu_forward(const Tensor& y, const Tensor& x, TensorCheck device);
void check_gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, TensorCheck device);

// x (rows, 2 * features) = [gate | up] per row; y and dy (rows, features).
struct SwigluDims {
  int64_t rows, features;
};
SwigluDims check_swiglu_forward(const Tensor& y, const Tensor& x, TensorCheck device);
SwigluDims check_swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, TensorCheck device);
// The FP8-cast forms: q (rows, F) or (rows, 2F) and q_t transposed, as checks::check_fp8_casts.
SwigluDims check_swiglu_forward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                    const Tensor& scale, TensorCheck device);
SwigluDims check_swiglu_backward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& dy,
                                     const Tensor& x, const Tensor& scale, TensorCheck device);

}  // namespace megatron::ops::checks
