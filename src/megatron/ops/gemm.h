#pragma once
// GEMM and the linear layer built on it.
//   matmul:  C = alpha * op(A) @ op(B) + beta * C      (2-D views; C may be f32 while A, B are bf16/f16)
//   linear_forward:  Y (N,out) = X (N,in) @ W(out,in)^T (+ b)
//   linear_backward: dX  = dY @ W           (overwrites; skipped when dX undefined)
//                    dW += dY^T @ X         (accumulates into the fp32 main grad)
//                    db += sum_rows(dY)     (accumulates; skipped when db undefined)
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

namespace cpu {
void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params);
void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params);
void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias);
void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight);
}  // namespace cuda

}  // namespace megatron::ops
