#pragma once
// What the GPU benchmark programs share (bench/*.cpp built by CMake, bench/kernels/*.cu built by
// hand): random inputs made on the GPU, a call's median time by CUDA events, and the normwise error
// of a result against a reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/event_timer.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/random.h"

namespace megatron::bench {

// scale times N(0,1) values on the GPU, element i CounterRng{seed, 1}.normal(i) (ops::fill_normal)
// multiplied in f32 and rounded once to dtype. Random, never zeros: zeros can run faster than real
// data.
inline Tensor random_gpu(const Shape& shape, uint64_t seed, DType dtype = DType::bf16, float scale = 1.0f) {
  Tensor normal = Tensor::empty(shape, DType::f32, Device::cuda(0));
  ops::fill_normal(normal, {.seed = seed, .stream = 1});
  Tensor out = Tensor::empty(shape, dtype, Device::cuda(0));
  ops::scale(out, normal, scale);
  return out;
}

// ||x - ref|| / ||ref|| in f64 on the host, NaN when x holds a NaN.
inline double normwise_error(const Tensor& x, const Tensor& ref) {
  const Tensor a = x.to(Device::cpu()).to(DType::f64), b = ref.to(Device::cpu()).to(DType::f64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (pa[i] - pb[i]) * (pa[i] - pb[i]);
    den += pb[i] * pb[i];
  }
  return std::sqrt(num / den);
}

// Median milliseconds of fn over `iters` calls after `warmup` calls, each timed by events around
// it on the ops' stream.
inline double median_ms(const std::function<void()>& fn, int warmup = 3, int iters = 15) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    cuda::event_timer_reset();
    const int64_t start = cuda::event_timer_record();
    fn();
    const int64_t end = cuda::event_timer_record();
    cuda::event_timer_synchronize();
    times.push_back(cuda::event_timer_elapsed_ms(start, end));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace megatron::bench
