// Counter-based random fills on CUDA: the same Philox stream and Box-Muller as the CPU
// (core/rng.h), so a tensor filled here equals the CPU's up to the rounding of logf/cosf.
#include "megatron/core/rng.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/random.h"

namespace megatron::ops::cuda {
namespace {

template <class T>
__global__ void fill_normal_kernel(T* out, int64_t n, CounterRng rng, uint64_t offset) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(rng.normal(offset + uint64_t(i)));
}

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::fill_normal(Tensor& out, const RandomParams& params) {
  check_cuda(out, "fill_normal out");
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_storage(out.dtype(), "fill_normal", [&]<class T>(std::type_identity<T>) {
    fill_normal_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(static_cast<T*>(out.raw()), n,
                                                                  CounterRng{params.seed, params.stream}, params.offset);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
