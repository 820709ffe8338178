// MoE token permutation on CUDA: gathers only (one block per output row, threads along H, 16-byte
// accesses where the rows allow), so results are deterministic; arithmetic in float, one rounding
// per stored element, experts summed in index order as on the CPU.
#include "megatron/ops/checks/moe_permute.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/moe_permute.h"

namespace megatron::ops::cuda {
namespace {

// V elements per access: 16-byte packs where every row starts on a 16-byte boundary (packable),
// else 1. A block per output row (token for unpermute), threads along the row's packs.
template <class T, int V>
__global__ void permute_kernel(T* rows, const T* x, const int32_t* row_token, const float* weight, int64_t N,
                               int64_t H) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* src = x + int64_t(row_token[r]) * H;
    const float w = weight ? weight[r] : 1.0f;
    for (int64_t h = int64_t(threadIdx.x) * V; h < H; h += int64_t(blockDim.x) * V) {
      float v[V];
      load_pack<V>(src + h, v);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] *= w;
      store_pack<V>(rows + r * H + h, v);
    }
  }
}

template <class T, int V>
__global__ void unpermute_kernel(T* out, const T* rows, const int32_t* token_rows, const float* weight, int64_t T_,
                                 int64_t E, int64_t H) {
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    for (int64_t h = int64_t(threadIdx.x) * V; h < H; h += int64_t(blockDim.x) * V) {
      float sum[V] = {};
      for (int64_t e = 0; e < E; ++e) {
        const int32_t r = token_rows[t * E + e];
        if (r < 0) continue;
        const float w = weight ? weight[t * E + e] : 1.0f;
        float v[V];
        load_pack<V>(rows + int64_t(r) * H + h, v);
#pragma unroll
        for (int j = 0; j < V; ++j) sum[j] = fmaf(w, v[j], sum[j]);
      }
      store_pack<V>(out + t * H + h, sum);
    }
  }
}

// One warp per (token, expert) pair; a lane's V-element products summed in order, then the warp's.
template <class T, int V>
__global__ void weight_backward_kernel(float* dweight, const T* dout, const T* rows, const int32_t* token_rows,
                                       int64_t pairs, int64_t E, int64_t H) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = int(threadIdx.x) % 32;
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; i < pairs; i += warps) {
    const int32_t r = token_rows[i];
    float dot = 0.0f;
    if (r >= 0)
      for (int64_t h = int64_t(lane) * V; h < H; h += 32 * V) {
        float d[V], x[V];
        load_pack<V>(dout + (i / E) * H + h, d);
        load_pack<V>(rows + r * H + h, x);
#pragma unroll
        for (int j = 0; j < V; ++j) dot = fmaf(d[j], x[j], dot);
      }
    dot = warp_reduce(dot, SumOp{});
    if (lane == 0) dweight[i] = dot;
  }
}

const float* optional_weight(const Tensor& w) { return w.defined() ? device_data<float>(w) : nullptr; }

// Whether rows of H elements of T at these (base) pointers all start on 16-byte boundaries.
template <class T>
bool packable(int64_t H, std::initializer_list<const Tensor*> tensors) {
  if (H % kPack<T> != 0) return false;
  for (const Tensor* t : tensors)
    if (!is_aligned16(t->raw())) return false;
  return true;
}

int threads_for(int64_t packs) { return int(std::clamp<int64_t>(ceil_div(packs, 32) * 32, 32, kThreads)); }

// Calls fn(std::integral_constant<int, V>) with V = kPack<T> for packable rows, else 1.
template <class T, class Fn>
void with_pack(bool packs, Fn&& fn) {
  if (packs) {
    fn(std::integral_constant<int, kPack<T>>{});
  } else {
    fn(std::integral_constant<int, 1>{});
  }
}

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::moe_permute(Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight) {
  checks::check_moe_permute(rows, x, row_token, row_weight, check_cuda);
  const int64_t N = rows.dim(0), H = rows.dim(1);
  if (N == 0 || H == 0) return;
  dispatch_storage(x.dtype(), "moe_permute", [&]<class T>(std::type_identity<T>) {
    with_pack<T>(packable<T>(H, {&rows, &x}), [&]<int V>(std::integral_constant<int, V>) {
      permute_kernel<T, V><<<unsigned(std::min(N, kMaxGridBlocks)), threads_for(H / V), 0, stream()>>>(
          device_data<T>(rows), device_data<T>(x), device_data<int32_t>(row_token), optional_weight(row_weight), N, H);
    });
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight) {
  checks::check_moe_unpermute(out, rows, token_rows, weight, check_cuda);
  const int64_t T_ = out.dim(0), H = out.dim(1);
  if (T_ == 0 || H == 0) return;
  dispatch_storage(rows.dtype(), "moe_unpermute", [&]<class T>(std::type_identity<T>) {
    with_pack<T>(packable<T>(H, {&out, &rows}), [&]<int V>(std::integral_constant<int, V>) {
      unpermute_kernel<T, V><<<unsigned(std::min(T_, kMaxGridBlocks)), threads_for(H / V), 0, stream()>>>(
          device_data<T>(out), device_data<T>(rows), device_data<int32_t>(token_rows), optional_weight(weight), T_,
          token_rows.dim(1), H);
    });
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_unpermute_weight_backward(Tensor& dweight, const Tensor& dout, const Tensor& rows,
                                         const Tensor& token_rows) {
  checks::check_moe_unpermute_weight_backward(dweight, dout, rows, token_rows, check_cuda);
  const int64_t pairs = token_rows.numel();
  if (pairs == 0) return;
  dispatch_storage(dout.dtype(), "moe_unpermute_weight_backward", [&]<class T>(std::type_identity<T>) {
    with_pack<T>(packable<T>(dout.dim(1), {&dout, &rows}), [&]<int V>(std::integral_constant<int, V>) {
      weight_backward_kernel<T, V><<<grid_for(pairs * 32), kThreads, 0, stream()>>>(
          device_data<float>(dweight), device_data<T>(dout), device_data<T>(rows), device_data<int32_t>(token_rows),
          pairs, token_rows.dim(1), dout.dim(1));
    });
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
