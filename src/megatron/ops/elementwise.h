#pragma once
// Small elementwise and layout ops.
//   add:        out = a + b          (same numel; out may alias a or b) — the residual add
//   add_scaled: out += alpha * x     (accumulate)
//   scale:      out = alpha * x      (out may alias x)
//   cast:       out = x converted to out's dtype (same numel)
//   transpose01: out (D1,D0,rest...) = in (D0,D1,rest...)  e.g. (B,S) tokens <-> (S,B)
#include "megatron/core/tensor.h"

namespace megatron::ops {

void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_scaled(Tensor& out, const Tensor& x, float alpha);
void scale(Tensor& out, const Tensor& x, float alpha);
void cast(Tensor& out, const Tensor& x);
void transpose01(Tensor& out, const Tensor& in);

namespace cpu {
void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_scaled(Tensor& out, const Tensor& x, float alpha);
void scale(Tensor& out, const Tensor& x, float alpha);
void cast(Tensor& out, const Tensor& x);
void transpose01(Tensor& out, const Tensor& in);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void add(Tensor& out, const Tensor& a, const Tensor& b);
void add_scaled(Tensor& out, const Tensor& x, float alpha);
void scale(Tensor& out, const Tensor& x, float alpha);
void cast(Tensor& out, const Tensor& x);
void transpose01(Tensor& out, const Tensor& in);
}  // namespace cuda

}  // namespace megatron::ops
