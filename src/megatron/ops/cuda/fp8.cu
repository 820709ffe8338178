// The FP8 quantiser and the recipes' scale update on CUDA. The cast is the hardware's
// cvt.rn.satfinite (__nv_cvt_float_to_fp8 with __NV_SATFINITE): nearest even, saturating, as the
// CPU reference rounds (core/dtype.h), so the two agree bit for bit. amax is reduced per block,
// then merged with atomicMax on the magnitudes' bit patterns (order-independent, so deterministic;
// NaN sorts above infinity, as on the CPU). The scale update is one thread: the history is short.
#include <cuda_fp8.h>

#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cuda {
namespace {

__device__ __forceinline__ unsigned magnitude_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Every thread's running max of magnitude bits, merged over the block, then into amax.
__device__ __forceinline__ void merge_amax(float* amax, unsigned bits) {
  bits = block_reduce(bits, MaxOp{}, 0u);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits);
}

template <class T>
__global__ void amax_kernel(float* amax, const T* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned bits = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bits = max(bits, magnitude_bits(to_float(x[i])));
  merge_amax(amax, bits);
}

// q = cvt(x * scale); amax may be null.
template <class T>
__global__ void quantize_kernel(__nv_fp8_storage_t* q, float* amax, const T* x, const float* scale, int64_t n,
                                __nv_fp8_interpretation_t format) {
  const float s = *scale;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned bits = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = to_float(x[i]);
    bits = max(bits, magnitude_bits(v));
    q[i] = __nv_cvt_float_to_fp8(__fmul_rn(v, s), __NV_SATFINITE, format);  // no FMA contraction
  }
  if (amax != nullptr) merge_amax(amax, bits);
}

// The recipe's update (ops/fp8.h), in the CPU reference's order of operations.
__global__ void update_scale_kernel(float* scale, float* scale_inv, float* history, int64_t len, float fp8_max,
                                    bool use_max, float margin_factor) {
  float amax = history[0];
  if (use_max)
    for (int64_t i = 1; i < len; ++i) amax = __uint_as_float(max(magnitude_bits(amax), magnitude_bits(history[i])));
  if (isfinite(amax) && amax > 0.0f) *scale = __fdiv_rn(__fdiv_rn(fp8_max, amax), margin_factor);
  *scale_inv = __fdiv_rn(1.0f, *scale);
  const float first = history[0];
  for (int64_t i = 0; i + 1 < len; ++i) history[i] = history[i + 1];
  history[len - 1] = first;
  history[0] = 0.0f;
}

void check_cuda_floating(const Tensor& t, const char* name) {
  dispatch_storage(t.dtype(), name, []<class T>(std::type_identity<T>) {});
}

unsigned amax_grid(int64_t n) { return unsigned(std::clamp<int64_t>(ceil_div(n, kThreads), 1, 1024)); }

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::fp8_amax(Tensor& amax, const Tensor& x) {
  checks::check_fp8_amax(amax, x, check_cuda, check_cuda_floating);
  if (x.numel() == 0) return;
  dispatch_storage(x.dtype(), "fp8_amax", [&]<class T>(std::type_identity<T>) {
    amax_kernel<T>
        <<<amax_grid(x.numel()), kThreads, 0, stream()>>>(device_data<float>(amax), device_data<T>(x), x.numel());
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_quantize(Tensor& q, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize(q, amax, x, scale, check_cuda, check_cuda_floating);
  if (x.numel() == 0) return;
  const __nv_fp8_interpretation_t format = q.dtype() == DType::e4m3 ? __NV_E4M3 : __NV_E5M2;
  float* amax_ptr = amax.defined() ? device_data<float>(amax) : nullptr;
  dispatch_storage(x.dtype(), "fp8_quantize", [&]<class T>(std::type_identity<T>) {
    quantize_kernel<T><<<amax_grid(x.numel()), kThreads, 0, stream()>>>(static_cast<__nv_fp8_storage_t*>(q.raw()),
                                                                        amax_ptr, device_data<T>(x),
                                                                        device_data<float>(scale), x.numel(), format);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_update_scale(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe) {
  checks::check_fp8_update_scale(scale, scale_inv, amax_history, fp8_dtype, recipe, check_cuda);
  update_scale_kernel<<<1, 1, 0, stream()>>>(
      device_data<float>(scale), device_data<float>(scale_inv), device_data<float>(amax_history), amax_history.numel(),
      fp8_max(fp8_dtype), recipe.amax_compute_algo == AmaxComputeAlgo::max, std::ldexp(1.0f, int(recipe.margin)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops
