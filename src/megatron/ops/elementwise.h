#pragma once
// Small elementwise and layout ops.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// out = a + b          (same numel; out may alias a or b) — the residual add
MEGATRON_OP(add, void(Tensor& out, const Tensor& a, const Tensor& b));
// out += alpha * x     (accumulate)
MEGATRON_OP(add_scaled, void(Tensor& out, const Tensor& x, float alpha));
// out = alpha * x      (out may alias x)
MEGATRON_OP(scale, void(Tensor& out, const Tensor& x, float alpha));
// out = x converted to out's dtype (same numel)
MEGATRON_OP(cast, void(Tensor& out, const Tensor& x));
// out (D1,D0,rest...) = in (D0,D1,rest...)  e.g. (B,S) tokens <-> (S,B)
MEGATRON_OP(transpose01, void(Tensor& out, const Tensor& in));

}  // namespace megatron::ops
