#pragma once
// Tensors filled with counter-based random numbers (core/rng.h): element i gets
// CounterRng{seed, stream}.normal(offset + i), rounded to the tensor's dtype, the same on every
// backend. `offset` is the global index of the first element when the tensor is a shard of a
// larger one, so every layout draws the same values.
#include <cstdint>

#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct RandomParams {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;  // counter of element 0
};

// out = standard normal values (Box-Muller on Philox4x32-10).
MEGATRON_OP(fill_normal, void(Tensor& out, const RandomParams& params));

}  // namespace megatron::ops
