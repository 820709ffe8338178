#pragma once
// MLP activations. Backward overwrites dx.
//   GELU (tanh approximation, GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   SwiGLU on the fused fc1 output x (N, 2F), each row [gate (F) | up (F)]:
//     y (N,F) = silu(gate) * up,   silu(g) = g * sigmoid(g)
//   Under TP each rank's row is [gate_local | up_local], so the same op serves every layout.
#include "megatron/core/tensor.h"

namespace megatron::ops {

void gelu_forward(Tensor& y, const Tensor& x);
void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(Tensor& y, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);

namespace cpu {
void gelu_forward(Tensor& y, const Tensor& x);
void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(Tensor& y, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void gelu_forward(Tensor& y, const Tensor& x);
void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(Tensor& y, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);
}  // namespace cuda

}  // namespace megatron::ops
