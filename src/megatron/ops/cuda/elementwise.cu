// Elementwise and layout ops on CUDA. Each thread handles 8 consecutive elements through 16-byte
// accesses when every pointer is 16-byte aligned (one 16-bit access or two float ones), else single
// elements; arithmetic in float, rounded once into the output. Products and sums are written
// with explicit rounding (__fmul_rn, __fadd_rn) so no multiply-add is fused: the results then
// round exactly as the CPU reference's do.
#include "megatron/ops/checks/elementwise.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/elementwise.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kVec = 8;  // elements per thread step on the vector path

// out[i] = op(x[i])
template <bool kVector, class Op, class O, class I>
__global__ void map1_kernel(O* out, const I* x, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    const int64_t chunks = n / kVec;
    for (int64_t c = tid; c < chunks; c += stride) {
      float v[kVec];
      load_floats<kVec>(x + c * kVec, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = op(v[j]);
      store_floats<kVec>(out + c * kVec, v);
    }
    done = chunks * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = from_float<O>(op(to_float(x[i])));
}

// out[i] = op(a[i], b[i]); out may be a or b (each element is read before it is written, by the
// same thread).
template <bool kVector, class Op, class O, class A, class B>
__global__ void map2_kernel(O* out, const A* a, const B* b, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    const int64_t chunks = n / kVec;
    for (int64_t c = tid; c < chunks; c += stride) {
      float va[kVec], vb[kVec];
      load_floats<kVec>(a + c * kVec, va);
      load_floats<kVec>(b + c * kVec, vb);
#pragma unroll
      for (int j = 0; j < kVec; ++j) va[j] = op(va[j], vb[j]);
      store_floats<kVec>(out + c * kVec, va);
    }
    done = chunks * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = from_float<O>(op(to_float(a[i]), to_float(b[i])));
}

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Scale {
  float alpha;
  __device__ float operator()(float x) const { return __fmul_rn(alpha, x); }
};
struct Add {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct AddScaled {  // (out, x) -> out + alpha x
  float alpha;
  __device__ float operator()(float o, float x) const { return __fadd_rn(o, __fmul_rn(alpha, x)); }
};

template <class Op, class O, class I>
void launch_map1(O* out, const I* x, int64_t n, Op op) {
  if (n == 0) return;
  if (is_aligned16(out) && is_aligned16(x)) {
    map1_kernel<true><<<grid_for(ceil_div(n, kVec)), kThreads, 0, stream()>>>(out, x, n, op);
  } else {
    map1_kernel<false><<<grid_for(n), kThreads, 0, stream()>>>(out, x, n, op);
  }
  CUDA_CHECK_LAUNCH();
}

template <class Op, class O, class A, class B>
void launch_map2(O* out, const A* a, const B* b, int64_t n, Op op) {
  if (n == 0) return;
  if (is_aligned16(out) && is_aligned16(a) && is_aligned16(b)) {
    map2_kernel<true><<<grid_for(ceil_div(n, kVec)), kThreads, 0, stream()>>>(out, a, b, n, op);
  } else {
    map2_kernel<false><<<grid_for(n), kThreads, 0, stream()>>>(out, a, b, n, op);
  }
  CUDA_CHECK_LAUNCH();
}

// out (D1,D0,rest) = in (D0,D1,rest), moving each row's `rest` block as words of W.
template <class W>
__global__ void transpose01_kernel(W* out, const W* in, int64_t d0, int64_t d1, int64_t words_per_row) {
  const int64_t total = d0 * d1 * words_per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < total; w += stride) {
    const int64_t out_row = w / words_per_row, k = w % words_per_row;
    const int64_t j = out_row / d0, i = out_row % d0;  // out row (j, i) is in row (i, j)
    out[w] = in[(i * d1 + j) * words_per_row + k];
  }
}

template <class W>
void launch_transpose01(void* out, const void* in, int64_t d0, int64_t d1, size_t row_bytes) {
  const int64_t words = int64_t(row_bytes / sizeof(W));
  transpose01_kernel<W><<<grid_for(d0 * d1 * words), kThreads, 0, stream()>>>(static_cast<W*>(out),
                                                                              static_cast<const W*>(in), d0, d1, words);
  CUDA_CHECK_LAUNCH();
}

// out (D1,D0) = in (D0,D1) of one-element rows through a shared-memory tile, so both the reads and
// the writes are coalesced (the word-moving kernel above reads a 2-D matrix's columns with a stride
// of a row): FP8 weights' transposes (tensor_parallel/fp8_linear.h) among others.
constexpr int kTile = 32, kTileRows = 8;
template <class T>
__global__ void transpose2d_tiled_kernel(T* out, const T* in, int64_t d0, int64_t d1) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t i0 = int64_t(blockIdx.y) * kTile, j0 = int64_t(blockIdx.x) * kTile;
  for (int k = int(threadIdx.y); k < kTile; k += kTileRows) {
    const int64_t i = i0 + k, j = j0 + threadIdx.x;
    if (i < d0 && j < d1) tile[k][threadIdx.x] = in[i * d1 + j];
  }
  __syncthreads();
  for (int k = int(threadIdx.y); k < kTile; k += kTileRows) {
    const int64_t j = j0 + k, i = i0 + threadIdx.x;
    if (j < d1 && i < d0) out[j * d0 + i] = tile[threadIdx.x][k];
  }
}

template <class T>
void launch_transpose2d_tiled(void* out, const void* in, int64_t d0, int64_t d1) {
  const dim3 grid(unsigned((d1 + kTile - 1) / kTile), unsigned((d0 + kTile - 1) / kTile));
  transpose2d_tiled_kernel<T>
      <<<grid, dim3(kTile, kTileRows), 0, stream()>>>(static_cast<T*>(out), static_cast<const T*>(in), d0, d1);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::add(Tensor& out, const Tensor& a, const Tensor& b) {
  checks::check_add(out, a, b, check_cuda);
  dispatch_storage(a.dtype(), "add", [&]<class T>(std::type_identity<T>) {
    launch_map2(device_data<T>(out), device_data<T>(a), device_data<T>(b), out.numel(), Add{});
  });
}

void cuda::add_scaled(Tensor& out, const Tensor& x, float alpha) {
  checks::check_same_numel(out, x, "add_scaled out", "add_scaled x", check_cuda);
  dispatch_storage(out.dtype(), "add_scaled", [&]<class O>(std::type_identity<O>) {
    dispatch_storage(x.dtype(), "add_scaled", [&]<class I>(std::type_identity<I>) {
      O* o = device_data<O>(out);
      launch_map2(o, o, device_data<I>(x), out.numel(), AddScaled{alpha});
    });
  });
}

void cuda::scale(Tensor& out, const Tensor& x, float alpha) {
  checks::check_same_numel(out, x, "scale out", "scale x", check_cuda);
  dispatch_storage(out.dtype(), "scale", [&]<class O>(std::type_identity<O>) {
    dispatch_storage(x.dtype(), "scale", [&]<class I>(std::type_identity<I>) {
      launch_map1(device_data<O>(out), device_data<I>(x), out.numel(), Scale{alpha});
    });
  });
}

void cuda::cast(Tensor& out, const Tensor& x) {
  checks::check_same_numel(out, x, "cast out", "cast x", check_cuda);
  dispatch_storage(out.dtype(), "cast", [&]<class O>(std::type_identity<O>) {
    dispatch_storage(x.dtype(), "cast", [&]<class I>(std::type_identity<I>) {
      launch_map1(device_data<O>(out), device_data<I>(x), out.numel(), Identity{});
    });
  });
}

void cuda::transpose01(Tensor& out, const Tensor& in) {
  checks::check_transpose01(out, in, check_cuda);
  const auto* src = static_cast<const char*>(in.raw());
  auto* dst = static_cast<char*>(out.raw());
  const int64_t d0 = in.dim(0), d1 = in.dim(1);
  if (in.numel() == 0) return;
  const size_t row_bytes = size_t(in.numel() / (d0 * d1)) * in.element_size();
  if (row_bytes == in.element_size() && (d0 + kTile - 1) / kTile <= 65535) {  // a 2-D matrix: tiles
    if (row_bytes == 1) return launch_transpose2d_tiled<uint8_t>(dst, src, d0, d1);
    if (row_bytes == 2) return launch_transpose2d_tiled<uint16_t>(dst, src, d0, d1);
    if (row_bytes == 4) return launch_transpose2d_tiled<uint32_t>(dst, src, d0, d1);
  }
  // The widest word that divides the row and both base addresses.
  const uintptr_t common = uintptr_t(row_bytes) | reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if (common % 16 == 0) return launch_transpose01<uint4>(dst, src, d0, d1, row_bytes);
  if (common % 8 == 0) return launch_transpose01<uint2>(dst, src, d0, d1, row_bytes);
  if (common % 4 == 0) return launch_transpose01<uint32_t>(dst, src, d0, d1, row_bytes);
  if (common % 2 == 0) return launch_transpose01<uint16_t>(dst, src, d0, d1, row_bytes);
  launch_transpose01<uint8_t>(dst, src, d0, d1, row_bytes);
}

}  // namespace megatron::ops
