#pragma once
// Shared by the CUDA kernels (ops/cuda/*.cu): element conversion, 16-byte vector access, warp and
// block reductions, launch helpers, and the host-side dtype dispatch and tensor checks.
//
// Kernels compute in float (the reduce family in double); storage types are float, __nv_bfloat16
// and __half. f64 tensors are CPU-only and rejected by the dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/ops/checks/common.h"

namespace megatron::ops::cuda {

// Backend-neutral argument helpers (ops/checks/common.h).
using checks::accum_dtype;
using checks::check_defined;
using checks::check_numel;
using checks::rows_of;

// ---- element conversion -------------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as megatron::bf16 on the host
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// ---- 16-byte vector access ----------------------------------------------------------------

constexpr int kVecBytes = 16;
// Elements of T in one 16-byte access: 4 floats, 8 bf16/half.
template <class T>
constexpr int kPack = kVecBytes / int(sizeof(T));

__host__ __device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % kVecBytes) == 0;
}

// out[j] = float(p[j]) for j < N; p 16-byte aligned and N * sizeof(T) a multiple of 16
// (N = 8 is one access for bf16, two for float).
template <int N, class T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  static_assert((N * sizeof(T)) % kVecBytes == 0, "load_floats moves whole 16-byte words");
  constexpr int kWords = int(N * sizeof(T)) / kVecBytes;
  uint4 raw[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) raw[w] = reinterpret_cast<const uint4*>(p)[w];
  const T* elems = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = to_float(elems[j]);
}

// p[j] = T(in[j]) for j < N, same alignment rule as load_floats.
template <int N, class T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  static_assert((N * sizeof(T)) % kVecBytes == 0, "store_floats moves whole 16-byte words");
  constexpr int kWords = int(N * sizeof(T)) / kVecBytes;
  uint4 raw[kWords];
  T* elems = reinterpret_cast<T*>(raw);
#pragma unroll
  for (int j = 0; j < N; ++j) elems[j] = from_float<T>(in[j]);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
}

// V elements at p as floats: one scalar for V = 1, else whole 16-byte packs (the tail and
// misaligned paths of vectorised kernels use V = 1).
template <int V, class T>
__device__ __forceinline__ void load_pack(const T* p, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = to_float(*p);
  } else {
    load_floats<V>(p, v);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    *p = from_float<T>(v[0]);
  } else {
    store_floats<V>(p, v);
  }
}

// A range [p, p + n) cut at 16-byte boundaries: `head` scalar elements up to the first boundary,
// then `packs` whole kPack<T> packs, then scalar elements from head + packs * kPack<T> to n.
// Lets a row at any offset (odd vocabulary sizes) use vector access for its body.
struct AlignedSpan {
  int64_t head;
  int64_t packs;
};
template <class T>
__host__ __device__ __forceinline__ AlignedSpan aligned_span(const T* p, int64_t n) {
  const int64_t misalign = int64_t(reinterpret_cast<uintptr_t>(p) % kVecBytes);
  int64_t head = misalign == 0 ? 0 : (kVecBytes - misalign) / int64_t(sizeof(T));
  if (misalign % int64_t(sizeof(T)) != 0) head = n;  // not even element-aligned to a pack: all scalar
  head = head < n ? head : n;
  return {head, (n - head) / kPack<T>};
}

// ---- reductions ---------------------------------------------------------------------------

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

// Butterfly over the 32 lanes: every lane gets the result, the same on every run.
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over the block (blockDim.x a multiple of 32, at most 1024, 1-D block); every thread
// must call it and every thread gets the result. Safe to call several times in a row.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int warps = int(blockDim.x) / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call may still be reading partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : identity;
  return warp_reduce(v, op);
}
template <class T>
__device__ __forceinline__ T block_sum(T v) {
  return block_reduce(v, SumOp{}, T(0));
}
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, MaxOp{}, -INFINITY); }

// ---- launch helpers -----------------------------------------------------------------------

constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than this to fill any current GPU.
constexpr int64_t kMaxGridBlocks = int64_t(1) << 16;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over `items`, at least 1.
inline unsigned grid_for(int64_t items, int threads = kThreads) {
  return unsigned(std::clamp<int64_t>(ceil_div(items, threads), 1, kMaxGridBlocks));
}

// The stream every launch in ops/cuda uses (context.h: per-thread current stream).
inline cudaStream_t stream() { return megatron::cuda::current_stream(); }

// ---- host-side dtype dispatch and checks --------------------------------------------------

template <class T>
constexpr DType device_dtype();
template <>
constexpr DType device_dtype<float>() {
  return DType::f32;
}
template <>
constexpr DType device_dtype<__nv_bfloat16>() {
  return DType::bf16;
}
template <>
constexpr DType device_dtype<__half>() {
  return DType::f16;
}
template <>
constexpr DType device_dtype<int32_t>() {
  return DType::i32;
}

// The tensor's memory as the device type T, after checking its dtype matches.
template <class T>
T* device_data(Tensor& t) {
  check_dtype(t, device_dtype<T>(), "tensor");
  return static_cast<T*>(t.raw());
}
template <class T>
const T* device_data(const Tensor& t) {
  check_dtype(t, device_dtype<T>(), "tensor");
  return static_cast<const T*>(t.raw());
}

// Activation and weight dtypes of every op: f32, bf16 and f16. Kernels load each
// element into float and round once when storing, whatever the type. Usage:
//   dispatch_storage(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) { launch<T>(...); });
template <class Fn>
void dispatch_storage(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(std::type_identity<float>{});
    case DType::bf16:
      return fn(std::type_identity<__nv_bfloat16>{});
    case DType::f16:
      return fn(std::type_identity<__half>{});
    case DType::f64:
      MEGATRON_FAIL(
          op << ": f64 tensors are CPU-only (gradient checks); use f32, bf16 or f16 on CUDA, or --device cpu");
    default:
      break;
  }
  MEGATRON_FAIL(op << ": dtype " << dtype_name(dtype) << " is not supported on CUDA; use f32, bf16 or f16");
}

// t is defined and lives on the current CUDA device (the one whose stream the op launches on).
inline void check_cuda(const Tensor& t, const char* name) {
  check_defined(t, name);
  MEGATRON_CHECK(t.device().is_cuda(),
                 name << " is on " << t.device().str() << " but the op runs on CUDA; pass tensors on the GPU only");
  const int current = megatron::cuda::current_context().device();
  MEGATRON_CHECK(t.device().index == current, name << " is on " << t.device().str()
                                                   << " but the current device is cuda:" << current
                                                   << "; one process drives one GPU (init_device)");
}

// Like check_cuda, but an undefined tensor (an optional argument left out) passes.
inline void check_cuda_optional(const Tensor& t, const char* name) {
  if (t.defined()) check_cuda(t, name);
}

}  // namespace megatron::ops::cuda
