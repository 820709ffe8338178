#pragma once
// Argument checks of the sigmoid gate (ops/sigmoid_gate.h), shared by both backends.
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

void check_sigmoid_gate_forward(const Tensor& y, const Tensor& score, const Tensor& out, const Tensor& x,
                                const Tensor& w, TensorCheck device);
void check_sigmoid_gate_backward(const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& dy,
                                 const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& score,
                                 TensorCheck device);

}  // namespace megatron::ops::checks
