#pragma once
// Argument checks of the grouped GEMM (ops/grouped_gemm.h), shared by both backends.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/grouped_gemm.h"

namespace megatron::ops::checks {

void check_grouped_linear_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                                  const ExpertRows& rows, TensorCheck device);
void check_grouped_linear_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                                   const Tensor& weight, const ExpertRows& rows, TensorCheck device);

}  // namespace megatron::ops::checks
