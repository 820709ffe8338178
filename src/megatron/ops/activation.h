#pragma once
// MLP activations. Backward overwrites dx.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// GELU (tanh approximation, GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
MEGATRON_OP(gelu_forward, void(Tensor& y, const Tensor& x));
MEGATRON_OP(gelu_backward, void(Tensor& dx, const Tensor& dy, const Tensor& x));

// SwiGLU on the fused fc1 output x (N, 2F), each row [gate (F) | up (F)]:
//   y (N,F) = silu(gate) * up,   silu(g) = g * sigmoid(g)
// Under TP each rank's row is [gate_local | up_local], so the same op serves every layout.
MEGATRON_OP(swiglu_forward, void(Tensor& y, const Tensor& x));
MEGATRON_OP(swiglu_backward, void(Tensor& dx, const Tensor& dy, const Tensor& x));

}  // namespace megatron::ops
