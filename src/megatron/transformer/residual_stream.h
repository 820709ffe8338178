#pragma once
// The residual stream between pre-norm transformer layers, (S,B,C). Each layer ends with
// out = h + delta; that addition is left to the next norm (the next layer's input norm or the
// final norm), which fuses it with the normalisation (ops::add_norm_forward, Megatron/TE's fused
// residual add + norm). The stream's value is residual + delta, or residual alone when delta is
// undefined (the embeddings, and the final norm's output).
//
// Backward needs no such pair: the gradient of a sum reaches both summands unchanged, so the
// stream's gradient is one tensor.
#include "megatron/core/tensor.h"

namespace megatron {

struct ResidualStream {
  Tensor residual;
  Tensor delta;  // undefined: nothing deferred
};

}  // namespace megatron
