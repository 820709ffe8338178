// MoE token permutation on CUDA: gathers only (one block per output row, threads along H), so
// results are deterministic; arithmetic in float, one rounding per stored element, experts summed
// in index order as on the CPU.
#include "megatron/ops/checks/moe_permute.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/moe_permute.h"

namespace megatron::ops::cuda {
namespace {

template <class T>
__global__ void permute_kernel(T* rows, const T* x, const int32_t* row_token, const float* weight, int64_t N,
                               int64_t H) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const T* src = x + int64_t(row_token[r]) * H;
    const float w = weight ? weight[r] : 1.0f;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) rows[r * H + h] = from_float<T>(w * to_float(src[h]));
  }
}

template <class T>
__global__ void unpermute_kernel(T* out, const T* rows, const int32_t* token_rows, const float* weight, int64_t T_,
                                 int64_t E, int64_t H) {
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        const int32_t r = token_rows[t * E + e];
        if (r >= 0) sum = fmaf(weight ? weight[t * E + e] : 1.0f, to_float(rows[int64_t(r) * H + h]), sum);
      }
      out[t * H + h] = from_float<T>(sum);
    }
  }
}

// One warp per (token, expert) pair.
template <class T>
__global__ void weight_backward_kernel(float* dweight, const T* dout, const T* rows, const int32_t* token_rows,
                                       int64_t pairs, int64_t E, int64_t H) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = int(threadIdx.x) % 32;
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; i < pairs; i += warps) {
    const int32_t r = token_rows[i];
    float dot = 0.0f;
    if (r >= 0)
      for (int64_t h = lane; h < H; h += 32)
        dot = fmaf(to_float(dout[(i / E) * H + h]), to_float(rows[r * H + h]), dot);
    dot = warp_reduce(dot, SumOp{});
    if (lane == 0) dweight[i] = dot;
  }
}

const float* optional_weight(const Tensor& w) { return w.defined() ? device_data<float>(w) : nullptr; }

int threads_for(int64_t H) { return int(std::clamp<int64_t>(ceil_div(H, 32) * 32, 32, kThreads)); }

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::moe_permute(Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight) {
  checks::check_moe_permute(rows, x, row_token, row_weight, check_cuda);
  const int64_t N = rows.dim(0), H = rows.dim(1);
  if (N == 0 || H == 0) return;
  dispatch_storage(x.dtype(), "moe_permute", [&]<class T>(std::type_identity<T>) {
    permute_kernel<T><<<unsigned(std::min(N, kMaxGridBlocks)), threads_for(H), 0, stream()>>>(
        device_data<T>(rows), device_data<T>(x), device_data<int32_t>(row_token), optional_weight(row_weight), N, H);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight) {
  checks::check_moe_unpermute(out, rows, token_rows, weight, check_cuda);
  const int64_t T_ = out.dim(0), H = out.dim(1);
  if (T_ == 0 || H == 0) return;
  dispatch_storage(rows.dtype(), "moe_unpermute", [&]<class T>(std::type_identity<T>) {
    unpermute_kernel<T><<<unsigned(std::min(T_, kMaxGridBlocks)), threads_for(H), 0, stream()>>>(
        device_data<T>(out), device_data<T>(rows), device_data<int32_t>(token_rows), optional_weight(weight), T_,
        token_rows.dim(1), H);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_unpermute_weight_backward(Tensor& dweight, const Tensor& dout, const Tensor& rows,
                                         const Tensor& token_rows) {
  checks::check_moe_unpermute_weight_backward(dweight, dout, rows, token_rows, check_cuda);
  const int64_t pairs = token_rows.numel();
  if (pairs == 0) return;
  dispatch_storage(dout.dtype(), "moe_unpermute_weight_backward", [&]<class T>(std::type_identity<T>) {
    weight_backward_kernel<T><<<grid_for(pairs * 32), kThreads, 0, stream()>>>(
        device_data<float>(dweight), device_data<T>(dout), device_data<T>(rows), device_data<int32_t>(token_rows),
        pairs, token_rows.dim(1), dout.dim(1));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
