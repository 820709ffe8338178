// Inverted dropout on CUDA. The keep decision is ops::dropout_keep on the same counter-based
// Philox stream as the CPU, so the mask is bit-identical across backends and backward
// regenerates it instead of storing it.
#include "megatron/core/rng.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/dropout.h"

namespace megatron::ops::cuda {
namespace {

// out_i = in_i * (keep_i ? 1/(1-p) : 0): a multiply, not a select, so NaN and Inf in dropped
// elements still propagate, as on the CPU. In place is fine: element i reads only in_i.
template <class T, int V>
__global__ void dropout_kernel(T* out, const T* in, int64_t n, CounterRng rng, float p, uint64_t offset) {
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float v[V];
    if constexpr (V == 1) {
      v[0] = to_float(in[i]);
    } else {
      load_floats<V>(in + i, v);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const bool keep = p == 0.0f || dropout_keep(rng, offset + uint64_t(i + k), p);
      v[k] *= keep ? keep_scale : 0.0f;
    }
    if constexpr (V == 1) {
      out[i] = from_float<T>(v[0]);
    } else {
      store_floats<V>(out + i, v);
    }
  }
}

void dropout_apply(Tensor& out, const Tensor& in, const DropoutParams& p, const char* out_name, const char* in_name) {
  check_cuda(in, in_name);
  check_cuda(out, out_name);
  check_shape(out, in.shape(), out_name);
  check_dtype(out, in.dtype(), out_name);
  MEGATRON_CHECK(p.p >= 0.0f && p.p < 1.0f, "dropout probability " << p.p << " must be in [0, 1)");
  const int64_t n = in.numel();
  if (n == 0) return;
  dispatch_storage(in.dtype(), "dropout", [&]<class T>(std::type_identity<T>) {
    T* op = static_cast<T*>(out.raw());
    const T* ip = static_cast<const T*>(in.raw());
    const CounterRng rng{p.seed, p.stream};
    if (n % kPack<T> == 0 && is_aligned16(op) && is_aligned16(ip)) {
      dropout_kernel<T, kPack<T>><<<grid_for(n / kPack<T>), kThreads, 0, stream()>>>(op, ip, n, rng, p.p, p.offset);
    } else {
      dropout_kernel<T, 1><<<grid_for(n), kThreads, 0, stream()>>>(op, ip, n, rng, p.p, p.offset);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::dropout_forward(Tensor& y, const Tensor& x, const DropoutParams& params) {
  dropout_apply(y, x, params, "dropout y", "dropout x");
}

// dx = dy * mask / (1-p): the same mask and scale as forward.
void cuda::dropout_backward(Tensor& dx, const Tensor& dy, const DropoutParams& params) {
  dropout_apply(dx, dy, params, "dropout dx", "dropout dy");
}

}  // namespace megatron::ops
