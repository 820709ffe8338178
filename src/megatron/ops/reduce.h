#pragma once
// Reductions into a one-element accumulator (f32, or f64 for f64 inputs), accumulated (+=) so
// several tensors can be summed before one read-back.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// acc += sum(x^2)        (gradient norms)
MEGATRON_OP(sum_squares, void(Tensor& acc, const Tensor& x));
// acc += sum(a * b)      (masked loss sums: dot(losses, loss_mask))
MEGATRON_OP(dot, void(Tensor& acc, const Tensor& a, const Tensor& b));
// acc += number of NaN/Inf in x  (fp16 overflow detection)
MEGATRON_OP(count_nonfinite, void(Tensor& acc, const Tensor& x));
// acc += number of zeros (+0 and -0) in x  (--log-num-zeros-in-grad); acc may be f64 whatever x
// is, for counts exact beyond 2^24
MEGATRON_OP(count_zeros, void(Tensor& acc, const Tensor& x));

}  // namespace megatron::ops
