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

// SwiGLU with its output cast to FP8 for the next GEMM (Transformer Engine's activation-fused
// cast): the bytes of swiglu_forward into x's dtype followed by ops::fp8_quantize_transpose(q,
// q_t, amax, y, scale), without y ever stored: q (N, F) (skipped when undefined), q_t (F, N) FP8,
// amax (1) f32 max-accumulated (skipped when undefined), scale (1) f32. A producer can fuse the
// cast only where the scale is known before the tensor (the delayed recipe).
MEGATRON_OP(swiglu_forward_fp8, void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale));
// swiglu_backward's dx (N, 2F) cast the same way: q (N, 2F), q_t (2F, N).
MEGATRON_OP(swiglu_backward_fp8,
            void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dy, const Tensor& x, const Tensor& scale));

}  // namespace megatron::ops
