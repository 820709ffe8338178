#pragma once
// GEMM and the linear layer built on it. Backward overwrites dX and accumulates dW, db into the
// fp32 main grad (or writes dW over it: GradWrite).
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

enum class Transpose : bool { no = false, yes = true };

// How a backward op writes a weight gradient: added to the main grad, or over it (the first
// gradient of a step into a main grad that was not zeroed; its old values are never read, so
// they may be anything, NaN included).
enum class GradWrite : bool { accumulate = false, overwrite = true };

struct MatmulParams {
  Transpose trans_a = Transpose::no;
  Transpose trans_b = Transpose::no;
  float alpha = 1.0f;
  float beta = 0.0f;
  // fp8_matmul only: the tensor cores sum the products in their own accumulator without promoting
  // partial sums to fp32 at intervals (cuBLASLt's FAST_ACCUM; Transformer Engine's forward GEMMs,
  // whose use_split_accumulator is off). Faster, and less exact for long K; the CPU's emulation
  // sums exactly either way. The other GEMMs refuse it.
  bool fp8_fast_accumulation = false;
};

// C = alpha * op(A) @ op(B) + beta * C      (2-D views; C may be f32 while A, B are bf16/f16)
MEGATRON_OP(matmul, void(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params));

// Y (N,out) = X (N,in) @ W(out,in)^T (+ b)
MEGATRON_OP(linear_forward, void(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias));
// dX  = dY @ W           (overwrites; skipped when dX undefined)
// dW += dY^T @ X         (accumulates into the fp32 main grad, or overwrites it with
//                         GradWrite::overwrite; skipped when dW undefined: a TP layer computes
//                         dX first, then dW while dX's collective runs)
// db += sum_rows(dY)     (accumulates, whatever dweight_write says; skipped when db undefined;
//                         needs dW)
MEGATRON_OP(linear_backward, void(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                  const Tensor& weight, GradWrite dweight_write));

// The MLP's GELU fused into its GEMMs (GELU as in activation.h; cuBLASLt epilogues on CUDA).
// fc1 of a GELU MLP: pre (N,out) = X W^T (+ b),  Y = gelu(pre). Y is the GELU of the unrounded
// accumulator, rounded once; pre is written for the backward (the GELU input).
MEGATRON_OP(linear_gelu_forward,
            void(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias));
// fc2 of a GELU MLP: the backward of a linear layer whose input X (N,in) is gelu(pre), with
// dY @ W passed through the GELU's derivative:
//   dpre = (dY @ W) * gelu'(pre)   (overwrites; dY @ W is not rounded first)
//   dW += dY^T @ X, db += sum_rows(dY)   (as linear_backward, dW optional)
MEGATRON_OP(gelu_linear_backward, void(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                       const Tensor& weight, const Tensor& pre, GradWrite dweight_write));

}  // namespace megatron::ops
