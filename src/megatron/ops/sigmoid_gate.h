#pragma once
// A sigmoid gate on rows: each row of `out` scaled by the sigmoid of its input row's dot product
// with a weight vector (Megatron's shared-expert gate, --moe-shared-expert-gate). Rows of x and
// out are (N,H) views of their leading dimensions; w has H elements.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// score[t] = sigmoid(<x[t], w>)   (N) f32, f64 for f64 inputs; the dot product in that precision
// y[t] = score[t] * out[t]        (y may be out)
MEGATRON_OP(sigmoid_gate_forward, void(Tensor& y, Tensor& score, const Tensor& out, const Tensor& x, const Tensor& w));
// With g[t] = <dy[t], out[t]> score[t] (1 - score[t]), the gradient of the gate's logit:
//   dout[t] = score[t] dy[t]            (overwrites)
//   dx[t]   = g[t] w                    (overwrites: the gate's share of x's gradient)
//   dw     += sum_t g[t] x[t]           (accumulates into the f32 main grad, f64 for f64)
MEGATRON_OP(sigmoid_gate_backward, void(Tensor& dout, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& out,
                                        const Tensor& x, const Tensor& w, const Tensor& score));

}  // namespace megatron::ops
