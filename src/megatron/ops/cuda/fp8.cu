// The FP8 quantiser and the recipes' scale update on CUDA. The cast is the hardware's
// cvt.rn.satfinite (__nv_cvt_float_to_fp8 with __NV_SATFINITE): nearest even, saturating, as the
// CPU reference rounds (core/dtype.h), so the two agree bit for bit. amax is reduced per block,
// then merged with atomicMax on the magnitudes' bit patterns (order-independent, so deterministic;
// NaN sorts above infinity, as on the CPU). The kernels move x in 16-byte packs where it is aligned
// (the casts are bandwidth-bound). The scale update is one block over a copy of the history, so
// the roll writes in parallel what it reads.
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

// V FP8 codes stored as one access.
template <int V>
struct alignas(V) Fp8Pack {
  __nv_fp8_storage_t code[V];
};

__device__ __forceinline__ __nv_fp8_storage_t cast_fp8(float v, float s, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, s), __NV_SATFINITE, format);  // no FMA contraction
}

// q = cvt(x * scale), V elements per access (V = 1: any alignment); amax may be null.
template <class T, int V>
__global__ void quantize_kernel(__nv_fp8_storage_t* q, float* amax, const T* x, const float* scale, int64_t n,
                                __nv_fp8_interpretation_t format) {
  const float s = *scale;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned bits = 0;
  const int64_t packs = n / V;
  for (int64_t p = first; p < packs; p += stride) {
    float v[V];
    load_pack<V>(x + p * V, v);
    Fp8Pack<V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      bits = max(bits, magnitude_bits(v[j]));
      out.code[j] = cast_fp8(v[j], s, format);
    }
    reinterpret_cast<Fp8Pack<V>*>(q)[p] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {  // the tail after the last whole pack
    const float v = to_float(x[i]);
    bits = max(bits, magnitude_bits(v));
    q[i] = cast_fp8(v, s, format);
  }
  if (amax != nullptr) merge_amax(amax, bits);
}

// Cast-transpose of x (rows, cols) in 64 x 64 tiles: each thread casts 8 adjacent elements of a
// row (one 16-byte load for 16-bit x), writes them to q (if any) and to a shared tile, then writes
// 8 adjacent codes of a q_t row from the tile's column. Vector accesses where the rows allow,
// element by element at ragged edges.
constexpr int kTransposeTile = 64, kTransposeThreads = 256, kSeg = 8;
template <class T>
__global__ void quantize_transpose_kernel(__nv_fp8_storage_t* q, __nv_fp8_storage_t* q_t, float* amax, const T* x,
                                          const float* scale, int64_t rows, int64_t cols, bool load_vectors,
                                          bool store_vectors, __nv_fp8_interpretation_t format) {
  __shared__ alignas(8) __nv_fp8_storage_t tile[kTransposeTile][kTransposeTile + kSeg];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kTransposeTile, c0 = int64_t(blockIdx.x) * kTransposeTile;
  const int seg = int(threadIdx.x) % kSeg * kSeg, line0 = int(threadIdx.x) / kSeg;
  constexpr int kLines = kTransposeThreads / kSeg;  // 32 rows (or q_t rows) per pass
  unsigned bits = 0;
  for (int line = line0; line < kTransposeTile; line += kLines) {
    const int64_t r = r0 + line, c = c0 + seg;
    if (r >= rows) break;
    Fp8Pack<kSeg> out;
    if (load_vectors && c + kSeg <= cols) {
      float v[kSeg];
      load_floats<kSeg>(x + r * cols + c, v);
#pragma unroll
      for (int j = 0; j < kSeg; ++j) {
        bits = max(bits, magnitude_bits(v[j]));
        out.code[j] = cast_fp8(v[j], s, format);
      }
      if (q != nullptr) *reinterpret_cast<Fp8Pack<kSeg>*>(q + r * cols + c) = out;
    } else {
      for (int j = 0; j < kSeg && c + j < cols; ++j) {
        const float v = to_float(x[r * cols + c + j]);
        bits = max(bits, magnitude_bits(v));
        out.code[j] = cast_fp8(v, s, format);
        if (q != nullptr) q[r * cols + c + j] = out.code[j];
      }
    }
    *reinterpret_cast<Fp8Pack<kSeg>*>(&tile[line][seg]) = out;
  }
  if (amax != nullptr) merge_amax(amax, bits);  // its __syncthreads also orders the tile
  else __syncthreads();
  for (int line = line0; line < kTransposeTile; line += kLines) {
    const int64_t c = c0 + line, r = r0 + seg;  // q_t row c, columns r .. r + 7
    if (c >= cols) break;
    if (store_vectors && r + kSeg <= rows) {
      Fp8Pack<kSeg> out;
#pragma unroll
      for (int j = 0; j < kSeg; ++j) out.code[j] = tile[seg + j][line];
      *reinterpret_cast<Fp8Pack<kSeg>*>(q_t + c * rows + r) = out;
    } else {
      for (int j = 0; j < kSeg && r + j < rows; ++j) q_t[c * rows + r + j] = tile[seg + j][line];
    }
  }
}

// The recipe's update (ops/fp8.h) in the CPU reference's arithmetic, one block: amax from `old`
// (a copy of the history), the roll written into `history`.
__global__ void update_scale_kernel(float* scale, float* scale_inv, float* history, const float* old, int64_t len,
                                    float fp8_max, bool use_max, float margin_factor) {
  unsigned bits = 0;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    if (use_max) bits = max(bits, magnitude_bits(old[i]));
    // TE's roll by -1 (each entry moves down one, the first to the end), then history[0] = 0.
    history[i] = i == 0 ? 0.0f : old[i + 1 < len ? i + 1 : 0];
  }
  bits = block_reduce(bits, MaxOp{}, 0u);
  if (threadIdx.x != 0) return;
  const float amax = use_max && len > 1 ? __uint_as_float(bits) : old[0];  // the CPU's: one entry as it is
  if (isfinite(amax) && amax > 0.0f) *scale = __fdiv_rn(__fdiv_rn(fp8_max, amax), margin_factor);
  *scale_inv = __fdiv_rn(1.0f, *scale);
}

void check_cuda_floating(const Tensor& t, const char* name) {
  dispatch_storage(t.dtype(), name, []<class T>(std::type_identity<T>) {});
}

__nv_fp8_interpretation_t fp8_format(DType dtype) { return dtype == DType::e4m3 ? __NV_E4M3 : __NV_E5M2; }

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
  const int64_t n = x.numel();
  if (n == 0) return;
  float* amax_ptr = amax.defined() ? device_data<float>(amax) : nullptr;
  auto* codes = static_cast<__nv_fp8_storage_t*>(q.raw());
  dispatch_storage(x.dtype(), "fp8_quantize", [&]<class T>(std::type_identity<T>) {
    constexpr int V = kPack<T>;
    const T* xs = device_data<T>(x);
    // Packs where x starts on a 16-byte boundary and q on a pack's (allocations do; views may not).
    if (is_aligned16(xs) && reinterpret_cast<uintptr_t>(codes) % V == 0) {
      quantize_kernel<T, V><<<amax_grid(ceil_div(n, V)), kThreads, 0, stream()>>>(
          codes, amax_ptr, xs, device_data<float>(scale), n, fp8_format(q.dtype()));
    } else {
      quantize_kernel<T, 1><<<amax_grid(n), kThreads, 0, stream()>>>(codes, amax_ptr, xs, device_data<float>(scale),
                                                                      n, fp8_format(q.dtype()));
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_quantize_transpose(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize_transpose(q, q_t, amax, x, scale, check_cuda, check_cuda_floating);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned(ceil_div(cols, kTransposeTile)), unsigned(ceil_div(rows, kTransposeTile)));
  MEGATRON_CHECK(grid.y <= 65535, "fp8_quantize_transpose: " << rows << " rows exceed the kernel's grid of "
                                                              << 65535 * kTransposeTile << "; split the tensor");
  auto* codes = q.defined() ? static_cast<__nv_fp8_storage_t*>(q.raw()) : nullptr;
  auto* codes_t = static_cast<__nv_fp8_storage_t*>(q_t.raw());
  const auto aligned8 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kSeg == 0; };
  dispatch_storage(x.dtype(), "fp8_quantize_transpose", [&]<class T>(std::type_identity<T>) {
    const T* xs = device_data<T>(x);
    // Every row's 8-element segments on 16-byte boundaries (x) and 8-byte ones (q, q_t).
    const bool load_vectors =
        is_aligned16(xs) && (cols * int64_t(sizeof(T))) % kVecBytes == 0 && cols % kSeg == 0 && aligned8(codes);
    const bool store_vectors = rows % kSeg == 0 && aligned8(codes_t);
    quantize_transpose_kernel<T><<<grid, kTransposeThreads, 0, stream()>>>(
        codes, codes_t, amax.defined() ? device_data<float>(amax) : nullptr, xs, device_data<float>(scale), rows, cols,
        load_vectors, store_vectors, fp8_format(q_t.dtype()));
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_update_scale(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe) {
  checks::check_fp8_update_scale(scale, scale_inv, amax_history, fp8_dtype, recipe, check_cuda);
  const Tensor old = amax_history.clone();  // read while the roll rewrites the history
  update_scale_kernel<<<1, kThreads, 0, stream()>>>(
      device_data<float>(scale), device_data<float>(scale_inv), device_data<float>(amax_history),
      device_data<float>(old), amax_history.numel(), fp8_max(fp8_dtype),
      recipe.amax_compute_algo == AmaxComputeAlgo::max, std::ldexp(1.0f, int(recipe.margin)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops
