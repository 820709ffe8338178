#include "megatron/ops/fp8.h"

namespace megatron::ops {

namespace {
Tensor one_on(Device device) {
  Tensor one = Tensor::empty({1}, DType::f32);
  one.fill(1.0);
  return one.to(device);  // a CPU tensor stays itself: each call makes its own
}
}  // namespace

void fp8_scaling_start(Fp8TensorScaling& s, int64_t history_len, Device device) {
  if (s.scale.defined()) return;
  s.scale = one_on(device);
  s.scale_inv = one_on(device);
  s.amax_history = Tensor::zeros({history_len}, DType::f32, device);
}

}  // namespace megatron::ops
