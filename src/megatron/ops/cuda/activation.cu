// GELU (tanh approximation) and SwiGLU on CUDA: elementwise grid-stride kernels over 16-byte
// packs when every pointer allows it, scalars otherwise. Arithmetic in float with the accurate
// tanhf/expf (not the fast intrinsics), so results track the CPU reference to float rounding.
// The FP8-cast forms run SwiGLU as the source of the FP8 cast-transpose (fp8_cast_transpose.cuh):
// the same arithmetic and rounding as the kernels here, then the cast.
#include "megatron/ops/activation.h"
#include "megatron/ops/checks/activation.h"
#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/cuda/fp8_cast_transpose.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluCubic = 0.044715f;

// y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
// dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = tanhf(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// silu(g) up
__device__ __forceinline__ float swiglu(float g, float u) { return g * sigmoid(g) * u; }
// silu'(g) = sig(g) (1 + g (1 - sig(g)));  dgate = dy up silu'(g);  dup = dy silu(g)
// (The fused multiply-add written out, so the unfused kernel and the fused cast's source round alike.)
__device__ __forceinline__ float swiglu_dgate(float d, float g, float u) {
  const float sg = sigmoid(g);
  return d * u * sg * __fmaf_rn(g, 1.0f - sg, 1.0f);
}
__device__ __forceinline__ float swiglu_dup(float d, float g) { return d * g * sigmoid(g); }

// n / V packs of V elements (n % V == 0).
template <class T, int V>
__global__ void gelu_forward_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float v[V];
    load_pack<V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = gelu(v[k]);
    store_pack<V>(y + i, v);
  }
}

template <class T, int V>
__global__ void gelu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    float v[V], d[V];
    load_pack<V>(x + i, v);
    load_pack<V>(dy + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] *= gelu_grad(v[k]);
    store_pack<V>(dx + i, d);
  }
}

// x (N, 2F) rows [gate | up] -> y (N, F) = silu(gate) * up; V divides F.
template <class T, int V>
__global__ void swiglu_forward_kernel(T* y, const T* x, int64_t N, int64_t F) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    const int64_t n = i / F, f = i % F;
    float g[V], u[V];
    load_pack<V>(x + n * 2 * F + f, g);
    load_pack<V>(x + n * 2 * F + F + f, u);
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] = swiglu(g[k], u[k]);
    store_pack<V>(y + i, g);
  }
}

template <class T, int V>
__global__ void swiglu_backward_kernel(T* dx, const T* dy, const T* x, int64_t N, int64_t F) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x * V) {
    const int64_t n = i / F, f = i % F;
    float g[V], u[V], d[V];
    load_pack<V>(x + n * 2 * F + f, g);
    load_pack<V>(x + n * 2 * F + F + f, u);
    load_pack<V>(dy + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float dgate = swiglu_dgate(d[k], g[k], u[k]);
      u[k] = swiglu_dup(d[k], g[k]);
      g[k] = dgate;
    }
    store_pack<V>(dx + n * 2 * F + f, g);
    store_pack<V>(dx + n * 2 * F + F + f, u);
  }
}

// swiglu_forward's y (N, F) element by element, for the FP8 cast (fp8::launch_cast_transpose).
template <class T>
struct SwigluSource {
  static constexpr int kOutputs = 1;
  const T* x;  // (N, 2F)
  int64_t F;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[1][8]) const {
    float u[8];
    load_floats<8>(x + r * 2 * F + c, v[0]);
    load_floats<8>(x + r * 2 * F + F + c, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[0][k] = fp8::as_stored<T>(swiglu(v[0][k], u[k]));
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[1]) const {
    v[0] = fp8::as_stored<T>(swiglu(to_float(x[r * 2 * F + c]), to_float(x[r * 2 * F + F + c])));
  }
};

// swiglu_backward's dx (N, 2F) as two column blocks, dgate (columns [0, F)) and dup ([F, 2F)),
// each element of both from one read of dy, gate and up.
template <class T>
struct SwigluGradSource {
  static constexpr int kOutputs = 2;
  const T* dy;  // (N, F)
  const T* x;   // (N, 2F)
  int64_t F;
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[2][8]) const {
    float d[8], g[8], u[8];
    load_floats<8>(dy + r * F + c, d);
    load_floats<8>(x + r * 2 * F + c, g);
    load_floats<8>(x + r * 2 * F + F + c, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[0][k] = fp8::as_stored<T>(swiglu_dgate(d[k], g[k], u[k]));
      v[1][k] = fp8::as_stored<T>(swiglu_dup(d[k], g[k]));
    }
  }
  __device__ __forceinline__ void load1(int64_t r, int64_t c, float (&v)[2]) const {
    const float d = to_float(dy[r * F + c]), g = to_float(x[r * 2 * F + c]);
    v[0] = fp8::as_stored<T>(swiglu_dgate(d, g, to_float(x[r * 2 * F + F + c])));
    v[1] = fp8::as_stored<T>(swiglu_dup(d, g));
  }
};

// 16-byte packs when `count` (the innermost run of contiguous elements) is whole packs and every
// pointer is 16-byte aligned.
template <class T>
bool packable(int64_t count, std::initializer_list<const void*> ptrs) {
  if (count % kPack<T> != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned16(p)) return false;
  return true;
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::gelu_forward(Tensor& y, const Tensor& x) {
  checks::check_gelu_forward(y, x, check_cuda);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_storage(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) {
    T* yp = static_cast<T*>(y.raw());
    const T* xp = static_cast<const T*>(x.raw());
    if (packable<T>(n, {yp, xp})) {
      gelu_forward_kernel<T, kPack<T>><<<grid_for(n / kPack<T>), kThreads, 0, stream()>>>(yp, xp, n);
    } else {
      gelu_forward_kernel<T, 1><<<grid_for(n), kThreads, 0, stream()>>>(yp, xp, n);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  checks::check_gelu_backward(dx, dy, x, check_cuda);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_storage(x.dtype(), "gelu_backward", [&]<class T>(std::type_identity<T>) {
    T* dxp = static_cast<T*>(dx.raw());
    const T* dyp = static_cast<const T*>(dy.raw());
    const T* xp = static_cast<const T*>(x.raw());
    if (packable<T>(n, {dxp, dyp, xp})) {
      gelu_backward_kernel<T, kPack<T>><<<grid_for(n / kPack<T>), kThreads, 0, stream()>>>(dxp, dyp, xp, n);
    } else {
      gelu_backward_kernel<T, 1><<<grid_for(n), kThreads, 0, stream()>>>(dxp, dyp, xp, n);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::swiglu_forward(Tensor& y, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_forward(y, x, check_cuda);
  const int64_t N = dims.rows, F = dims.features;
  if (N * F == 0) return;
  dispatch_storage(x.dtype(), "swiglu_forward", [&]<class T>(std::type_identity<T>) {
    T* yp = static_cast<T*>(y.raw());
    const T* xp = static_cast<const T*>(x.raw());
    if (packable<T>(F, {yp, xp})) {
      swiglu_forward_kernel<T, kPack<T>><<<grid_for(N * F / kPack<T>), kThreads, 0, stream()>>>(yp, xp, N, F);
    } else {
      swiglu_forward_kernel<T, 1><<<grid_for(N * F), kThreads, 0, stream()>>>(yp, xp, N, F);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_backward(dx, dy, x, check_cuda);
  const int64_t N = dims.rows, F = dims.features;
  if (N * F == 0) return;
  dispatch_storage(x.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    T* dxp = static_cast<T*>(dx.raw());
    const T* dyp = static_cast<const T*>(dy.raw());
    const T* xp = static_cast<const T*>(x.raw());
    if (packable<T>(F, {dxp, dyp, xp})) {
      swiglu_backward_kernel<T, kPack<T>><<<grid_for(N * F / kPack<T>), kThreads, 0, stream()>>>(dxp, dyp, xp, N, F);
    } else {
      swiglu_backward_kernel<T, 1><<<grid_for(N * F), kThreads, 0, stream()>>>(dxp, dyp, xp, N, F);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::swiglu_forward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  const checks::SwigluDims dims = checks::check_swiglu_forward_fp8(q, q_t, amax, x, scale, check_cuda);
  dispatch_storage(x.dtype(), "swiglu_forward_fp8", [&]<class T>(std::type_identity<T>) {
    const T* xp = static_cast<const T*>(x.raw());
    fp8::launch_cast_transpose(SwigluSource<T>{xp, dims.features}, packable<T>(dims.features, {xp}), q, q_t, amax,
                               scale, dims.rows, dims.features, "swiglu_forward_fp8");
  });
}

void cuda::swiglu_backward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dy, const Tensor& x,
                               const Tensor& scale) {
  const checks::SwigluDims dims = checks::check_swiglu_backward_fp8(q, q_t, amax, dy, x, scale, check_cuda);
  dispatch_storage(x.dtype(), "swiglu_backward_fp8", [&]<class T>(std::type_identity<T>) {
    const T* dyp = static_cast<const T*>(dy.raw());
    const T* xp = static_cast<const T*>(x.raw());
    fp8::launch_cast_transpose(SwigluGradSource<T>{dyp, xp, dims.features}, packable<T>(dims.features, {dyp, xp}), q,
                               q_t, amax, scale, dims.rows, dims.features, "swiglu_backward_fp8");
  });
}

}  // namespace megatron::ops
