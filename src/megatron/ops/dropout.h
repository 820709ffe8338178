#pragma once
// Inverted dropout with a regenerated mask: element i is kept when
// CounterRng{seed, stream}.uniform(offset + i) > p, and kept elements are scaled by 1/(1-p).
// `offset` is the global index of the tensor's first element when it is a shard of a larger
// tensor (a sequence-parallel rank's rows), so every layout draws the same mask for an element.
// Backward regenerates the same mask from (seed, stream); nothing is stored. p = 0 copies.
// y may alias x; dx may alias dy.
#include <cstdint>

#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// The keep rule of every dropout site (here and inside attention), on every backend.
MEGATRON_HD bool dropout_keep(const CounterRng& rng, uint64_t index, float p) { return rng.uniform(index) > p; }

struct DropoutParams {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;  // counter of element 0 (see above)
};

MEGATRON_OP(dropout_forward, void(Tensor& y, const Tensor& x, const DropoutParams& params));
MEGATRON_OP(dropout_backward, void(Tensor& dx, const Tensor& dy, const DropoutParams& params));

}  // namespace megatron::ops
