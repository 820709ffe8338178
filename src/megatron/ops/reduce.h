#pragma once
// Reductions into a one-element accumulator (f32, or f64 for f64 inputs), accumulated (+=) so
// several tensors can be summed before one read-back.
//   sum_squares: acc += sum(x^2)        (gradient norms)
//   dot:         acc += sum(a * b)      (masked loss sums: dot(losses, loss_mask))
//   count_nonfinite: acc += number of NaN/Inf in x  (fp16 overflow detection)
#include "megatron/core/tensor.h"

namespace megatron::ops {

void sum_squares(Tensor& acc, const Tensor& x);
void dot(Tensor& acc, const Tensor& a, const Tensor& b);
void count_nonfinite(Tensor& acc, const Tensor& x);

namespace cpu {
void sum_squares(Tensor& acc, const Tensor& x);
void dot(Tensor& acc, const Tensor& a, const Tensor& b);
void count_nonfinite(Tensor& acc, const Tensor& x);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void sum_squares(Tensor& acc, const Tensor& x);
void dot(Tensor& acc, const Tensor& a, const Tensor& b);
void count_nonfinite(Tensor& acc, const Tensor& x);
}  // namespace cuda

}  // namespace megatron::ops
