#pragma once
// GEMM and the linear layer built on it.
//   matmul:  C = alpha * op(A) @ op(B) + beta * C      (2-D views; C may be f32 while A, B are bf16/f16)
//   linear_forward:  Y (N,out) = X (N,in) @ W(out,in)^T (+ b)
//   linear_backward: dX  = dY @ W           (overwrites; skipped when dX undefined)
//                    dW += dY^T @ X         (accumulates into the fp32 main grad; skipped when dW
//                                            undefined: a TP layer computes dX first, then dW
//                                            while dX's collective runs)
//                    db += sum_rows(dY)     (accumulates; skipped when db undefined; needs dW)
// The MLP's GELU fused into its GEMMs (GELU as in activation.h; cuBLASLt epilogues on CUDA):
//   linear_gelu_forward:  pre (N,out) = X W^T (+ b),  Y = gelu(pre)      (fc1 of a GELU MLP)
//                         Y is the GELU of the unrounded accumulator, rounded once; pre is written
//                         for the backward (the GELU input).
//   gelu_linear_backward: the backward of a linear layer whose input X (N,in) is gelu(pre), with
//                         dY @ W passed through the GELU's derivative           (fc2 of a GELU MLP)
//                         dpre = (dY @ W) * gelu'(pre)   (overwrites; dY @ W is not rounded first)
//                         dW += dY^T @ X, db += sum_rows(dY)   (as linear_backward, dW optional)
#include "megatron/core/tensor.h"

namespace megatron::ops {

enum class Transpose : bool { no = false, yes = true };

struct MatmulParams {
  Transpose trans_a = Transpose::no;
  Transpose trans_b = Transpose::no;
  float alpha = 1.0f;
  float beta = 0.0f;
};

void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params);
void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight);
void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias);
void gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, const Tensor& pre);

namespace cpu {
void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params);
void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight);
void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias);
void gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, const Tensor& pre);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params);
void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight);
void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias);
void gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, const Tensor& pre);
}  // namespace cuda

}  // namespace megatron::ops
