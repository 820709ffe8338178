// The FP8 quantiser and the recipes' scale update on CUDA. The cast is the hardware's
// cvt.rn.satfinite (__nv_cvt_float_to_fp8 with __NV_SATFINITE): nearest even, saturating, as the
// CPU reference rounds (core/dtype.h), so the two agree bit for bit. amax is reduced per block,
// then merged with atomicMax on the magnitudes' bit patterns (order-independent, so deterministic;
// NaN sorts above infinity, as on the CPU). The kernels move x in 16-byte packs where it is aligned
// (the casts are bandwidth-bound). The scale update is one block over a copy of the history, so
// the roll writes in parallel what it reads. The blockwise cast (fp8_quantize_blockwise) computes
// each block's amax and scale exactly as the CPU does (the f32 division rounded to nearest, the
// mantissa cleared), so its codes and scale_invs match the CPU's bit for bit too.
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <vector>

#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/cuda/fp8_cast_transpose.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cuda {
namespace {

using fp8::magnitude_bits;
using fp8::merge_amax;

template <class T>
__global__ void amax_kernel(float* amax, const T* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned bits = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bits = max(bits, magnitude_bits(to_float(x[i])));
  merge_amax(amax, bits);
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
    fp8::Pack<V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      bits = max(bits, magnitude_bits(v[j]));
      out.code[j] = fp8::cast(v[j], s, format);
    }
    reinterpret_cast<fp8::Pack<V>*>(q)[p] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {  // the tail after the last whole pack
    const float v = to_float(x[i]);
    bits = max(bits, magnitude_bits(v));
    q[i] = fp8::cast(v, s, format);
  }
  if (amax != nullptr) merge_amax(amax, bits);
}

// The recipe's update (ops/fp8.h) in the CPU reference's arithmetic of up to kScaleBatch tensors,
// one block each (the batch travels in the kernel's parameters), in place: the history is rolled
// a chunk of blockDim entries at a time, each chunk's reads (entries i + 1) before its writes
// (entries i), and a later chunk reads only entries no earlier one wrote, so no copy of the
// history is needed; entry 0 is read by every thread before the first write.
constexpr int kScaleBatch = 64;
struct ScaleBatch {
  float* scale[kScaleBatch];
  float* scale_inv[kScaleBatch];
  float* history[kScaleBatch];
  float fp8_max[kScaleBatch];
};
__global__ void update_scales_kernel(const __grid_constant__ ScaleBatch batch, int64_t len, bool use_max,
                                     float margin_factor) {
  float* history = batch.history[blockIdx.x];
  const float first = history[0];
  unsigned bits = 0;
  for (int64_t base = 0; base < len; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    // TE's roll by -1 (each entry moves down one, the first to the end), then history[0] = 0.
    const float next = i < len ? (i + 1 < len ? history[i + 1] : first) : 0.0f;
    if (use_max) bits = max(bits, magnitude_bits(next));  // over i: every old entry once
    __syncthreads();
    if (i < len) history[i] = i == 0 ? 0.0f : next;
  }
  bits = block_reduce(bits, MaxOp{}, 0u);
  if (threadIdx.x != 0) return;
  float* scale = batch.scale[blockIdx.x];
  const float amax = use_max && len > 1 ? __uint_as_float(bits) : first;  // the CPU's: one entry as it is
  if (isfinite(amax) && amax > 0.0f) *scale = __fdiv_rn(__fdiv_rn(batch.fp8_max[blockIdx.x], amax), margin_factor);
  *batch.scale_inv[blockIdx.x] = __fdiv_rn(1.0f, *scale);
}

// ---- blockwise ----

// The block's scale from its amax's bit pattern: cpu/fp8.cpp's block_scale in the same f32 steps.
__device__ __forceinline__ float block_scale(unsigned amax_bits, float fp8_max) {
  const float amax = __uint_as_float(amax_bits);
  if (isinf(amax) || isnan(amax) || amax == 0.0f) return 1.0f;
  float scale = __fdiv_rn(fp8_max, amax);
  if (isinf(scale)) scale = FLT_MAX;
  return __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
}

constexpr int kTileWarps = kThreads / 32;
constexpr int kLanesPerTile = int(kFp8BlockSize) / 32;  // elements per lane of a 1x128 tile

// One 1x128 tile per warp: v holds the tile's elements lane + 32 j (0 past a ragged end); writes
// their codes through store(element, code) and returns the tile's scale_inv.
template <class Store>
__device__ __forceinline__ float cast_tile(const float (&v)[kLanesPerTile], int lane, float fp8_max,
                                           __nv_fp8_interpretation_t format, Store store) {
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < kLanesPerTile; ++j) bits = max(bits, magnitude_bits(v[j]));
  const float scale = block_scale(warp_reduce(bits, MaxOp{}), fp8_max);
#pragma unroll
  for (int j = 0; j < kLanesPerTile; ++j) store(lane + 32 * j, fp8::cast(v[j], scale, format));
  return __fdiv_rn(1.0f, scale);
}

// The 1x128 tiles of x (rows, cols) along its rows, one warp per tile: q (rows, cols) and its
// scale_inv (scale_ld per tile column).
template <class T>
__global__ void quantize_tiles_kernel(__nv_fp8_storage_t* q, float* scale_inv, const T* x, int64_t rows, int64_t cols,
                                      int64_t scale_ld, float fp8_max, __nv_fp8_interpretation_t format) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t r = int64_t(blockIdx.y) * kTileWarps + int(threadIdx.x) / 32, c0 = int64_t(blockIdx.x) * kFp8BlockSize;
  if (r >= rows) return;  // a whole warp: the shuffles stay full
  float v[kLanesPerTile];
#pragma unroll
  for (int j = 0; j < kLanesPerTile; ++j) {
    const int64_t c = c0 + lane + 32 * j;
    v[j] = c < cols ? to_float(x[r * cols + c]) : 0.0f;
  }
  const float inv = cast_tile(v, lane, fp8_max, format, [&](int i, __nv_fp8_storage_t code) {
    if (c0 + i < cols) q[r * cols + c0 + i] = code;
  });
  if (lane == 0) scale_inv[int64_t(blockIdx.x) * scale_ld + r] = inv;
}

// The 1x128 tiles of x^T: q_t (cols, rows), each tile 128 rows of one column of x. A block reads
// x's rows [r0, r0 + 128) x columns [c0, c0 + 32) into shared memory along the rows (coalesced),
// then each warp casts 4 of those columns as tiles and writes them as q_t rows (coalesced).
constexpr int kTransposedTileColumns = 32;
template <class T>
__global__ void quantize_transposed_tiles_kernel(__nv_fp8_storage_t* q_t, float* scale_inv, const T* x, int64_t rows,
                                                 int64_t cols, int64_t scale_ld, float fp8_max,
                                                 __nv_fp8_interpretation_t format) {
  __shared__ float tile[kFp8BlockSize][kTransposedTileColumns + 1];  // +1: no bank conflicts down a column
  const int64_t r0 = int64_t(blockIdx.y) * kFp8BlockSize, c0 = int64_t(blockIdx.x) * kTransposedTileColumns;
  for (int i = int(threadIdx.x); i < kFp8BlockSize * kTransposedTileColumns; i += blockDim.x) {
    const int rr = i / kTransposedTileColumns, cc = i % kTransposedTileColumns;
    const int64_t r = r0 + rr, c = c0 + cc;
    tile[rr][cc] = r < rows && c < cols ? to_float(x[r * cols + c]) : 0.0f;
  }
  __syncthreads();
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  for (int cc = warp; cc < kTransposedTileColumns; cc += kTileWarps) {
    const int64_t c = c0 + cc;  // the q_t row
    if (c >= cols) break;       // the same for the whole warp
    float v[kLanesPerTile];
#pragma unroll
    for (int j = 0; j < kLanesPerTile; ++j) v[j] = tile[lane + 32 * j][cc];
    const float inv = cast_tile(v, lane, fp8_max, format, [&](int i, __nv_fp8_storage_t code) {
      if (r0 + i < rows) q_t[c * rows + r0 + i] = code;
    });
    if (lane == 0) scale_inv[int64_t(blockIdx.y) * scale_ld + c] = inv;
  }
}

// One 128x128 block of x (rows, cols) per thread block: its amax, then its codes into q (rows,
// cols) and q_t (cols, rows) where given, its scale_inv at [i, j] of q's scales and [j, i] of q_t's.
template <class T>
__global__ void quantize_blocks_kernel(__nv_fp8_storage_t* q, float* q_scale_inv, int64_t q_scale_ld,
                                       __nv_fp8_storage_t* q_t, float* q_t_scale_inv, int64_t q_t_scale_ld, const T* x,
                                       int64_t rows, int64_t cols, float fp8_max, __nv_fp8_interpretation_t format) {
  constexpr int64_t B = kFp8BlockSize;
  const int64_t r0 = int64_t(blockIdx.y) * B, c0 = int64_t(blockIdx.x) * B;
  unsigned bits = 0;
  for (int64_t i = threadIdx.x; i < B * B; i += blockDim.x) {
    const int64_t r = r0 + i / B, c = c0 + i % B;
    if (r < rows && c < cols) bits = max(bits, magnitude_bits(to_float(x[r * cols + c])));
  }
  const float scale = block_scale(block_reduce(bits, MaxOp{}, 0u), fp8_max);
  for (int64_t i = threadIdx.x; i < B * B; i += blockDim.x) {
    const int64_t r = r0 + i / B, c = c0 + i % B;
    if (r >= rows || c >= cols) continue;
    const __nv_fp8_storage_t code = fp8::cast(to_float(x[r * cols + c]), scale, format);
    if (q != nullptr) q[r * cols + c] = code;
    if (q_t != nullptr) q_t[c * rows + r] = code;
  }
  if (threadIdx.x != 0) return;
  const float inv = __fdiv_rn(1.0f, scale);
  if (q_scale_inv != nullptr) q_scale_inv[int64_t(blockIdx.y) * q_scale_ld + blockIdx.x] = inv;
  if (q_t_scale_inv != nullptr) q_t_scale_inv[int64_t(blockIdx.x) * q_t_scale_ld + blockIdx.y] = inv;
}

// x's 1x128 tiles into q (transposed: false) or x^T's into q (transposed: true), after zeroing
// the scales' padding.
template <class T>
void launch_tiles(Tensor& q, Tensor& scale_inv, const T* x, int64_t rows, int64_t cols, bool transposed,
                  __nv_fp8_interpretation_t format) {
  CUDA_CHECK(cudaMemsetAsync(scale_inv.raw(), 0, size_t(scale_inv.numel()) * sizeof(float), stream()));
  if (rows == 0 || cols == 0) return;
  auto* codes = static_cast<__nv_fp8_storage_t*>(q.raw());
  const float max_value = fp8_max(q.dtype());
  if (transposed) {
    const dim3 grid(unsigned(ceil_div(cols, kTransposedTileColumns)), unsigned(ceil_div(rows, kFp8BlockSize)));
    MEGATRON_CHECK(grid.y <= 65535, "fp8_quantize_blockwise: " << rows << " rows exceed the kernel's grid; split x");
    quantize_transposed_tiles_kernel<T><<<grid, kThreads, 0, stream()>>>(codes, device_data<float>(scale_inv), x, rows,
                                                                         cols, scale_inv.dim(1), max_value, format);
  } else {
    const dim3 grid(unsigned(ceil_div(cols, kFp8BlockSize)), unsigned(ceil_div(rows, kTileWarps)));
    MEGATRON_CHECK(grid.y <= 65535, "fp8_quantize_blockwise: " << rows << " rows exceed the kernel's grid; split x");
    quantize_tiles_kernel<T><<<grid, kThreads, 0, stream()>>>(codes, device_data<float>(scale_inv), x, rows, cols,
                                                              scale_inv.dim(1), max_value, format);
  }
  CUDA_CHECK_LAUNCH();
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
          codes, amax_ptr, xs, device_data<float>(scale), n, fp8::format_of(q.dtype()));
    } else {
      quantize_kernel<T, 1><<<amax_grid(n), kThreads, 0, stream()>>>(codes, amax_ptr, xs, device_data<float>(scale), n,
                                                                     fp8::format_of(q.dtype()));
    }
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_quantize_transpose(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize_transpose(q, q_t, amax, x, scale, check_cuda, check_cuda_floating);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  dispatch_storage(x.dtype(), "fp8_quantize_transpose", [&]<class T>(std::type_identity<T>) {
    const T* xs = device_data<T>(x);
    // Every row's 8-element segments on 16-byte boundaries of x.
    const bool vectors = is_aligned16(xs) && (cols * int64_t(sizeof(T))) % kVecBytes == 0;
    fp8::launch_cast_transpose(fp8::PlainSource<T>{xs, cols}, vectors, q, q_t, amax, scale, rows, cols,
                               "fp8_quantize_transpose");
  });
}

void cuda::fp8_quantize_blockwise(Tensor& q, Tensor& q_scale_inv, Tensor& q_t, Tensor& q_t_scale_inv, const Tensor& x,
                                  Fp8BlockShape blocks) {
  checks::check_fp8_quantize_blockwise(q, q_scale_inv, q_t, q_t_scale_inv, x, blocks, check_cuda, check_cuda_floating);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const DType dtype = q.defined() ? q.dtype() : q_t.dtype();
  dispatch_storage(x.dtype(), "fp8_quantize_blockwise", [&]<class T>(std::type_identity<T>) {
    const T* xs = device_data<T>(x);
    if (blocks == Fp8BlockShape::tile_1x128) {
      if (q.defined()) launch_tiles(q, q_scale_inv, xs, rows, cols, false, fp8::format_of(dtype));
      // x^T's tiles run down x's columns (the token dimension).
      if (q_t.defined()) launch_tiles(q_t, q_t_scale_inv, xs, rows, cols, true, fp8::format_of(dtype));
      return;
    }
    for (Tensor* scales : {&q_scale_inv, &q_t_scale_inv})
      if (scales->defined())
        CUDA_CHECK(cudaMemsetAsync(scales->raw(), 0, size_t(scales->numel()) * sizeof(float), stream()));
    if (rows == 0 || cols == 0) return;
    const dim3 grid(unsigned(ceil_div(cols, kFp8BlockSize)), unsigned(ceil_div(rows, kFp8BlockSize)));
    MEGATRON_CHECK(grid.y <= 65535, "fp8_quantize_blockwise: " << rows << " rows exceed the 128x128 kernel's grid");
    quantize_blocks_kernel<T><<<grid, kThreads, 0, stream()>>>(
        q.defined() ? static_cast<__nv_fp8_storage_t*>(q.raw()) : nullptr,
        q.defined() ? device_data<float>(q_scale_inv) : nullptr, q.defined() ? q_scale_inv.dim(1) : 0,
        q_t.defined() ? static_cast<__nv_fp8_storage_t*>(q_t.raw()) : nullptr,
        q_t.defined() ? device_data<float>(q_t_scale_inv) : nullptr, q_t.defined() ? q_t_scale_inv.dim(1) : 0, xs, rows,
        cols, fp8_max(dtype), fp8::format_of(dtype));
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::fp8_update_scales(std::vector<Tensor>& scales, std::vector<Tensor>& scale_invs,
                             std::vector<Tensor>& amax_histories, const std::vector<DType>& fp8_dtypes,
                             const Fp8Recipe& recipe) {
  checks::check_fp8_update_scales(scales, scale_invs, amax_histories, fp8_dtypes, recipe, check_cuda);
  for (size_t first = 0; first < scales.size(); first += kScaleBatch) {
    const size_t n = std::min(scales.size() - first, size_t(kScaleBatch));
    ScaleBatch batch{};
    for (size_t i = 0; i < n; ++i) {
      batch.scale[i] = device_data<float>(scales[first + i]);
      batch.scale_inv[i] = device_data<float>(scale_invs[first + i]);
      batch.history[i] = device_data<float>(amax_histories[first + i]);
      batch.fp8_max[i] = fp8_max(fp8_dtypes[first + i]);
    }
    update_scales_kernel<<<unsigned(n), kThreads, 0, stream()>>>(batch, recipe.amax_history_len,
                                                                 recipe.amax_compute_algo == AmaxComputeAlgo::max,
                                                                 std::ldexp(1.0f, int(recipe.margin)));
    CUDA_CHECK_LAUNCH();
  }
}

void cuda::fp8_update_scale(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe) {
  std::vector<Tensor> scales{scale}, scale_invs{scale_inv}, histories{amax_history};
  cuda::fp8_update_scales(scales, scale_invs, histories, {fp8_dtype}, recipe);
}

}  // namespace megatron::ops
