// The sigmoid gate on CUDA: a warp per row for the dot products (lanes along the row, then the
// warp's sum), the sigmoid and the row's outputs; dw's sum over rows in two passes without
// atomics (fixed row chunks, then the chunks in order), so results are deterministic. Arithmetic
// in float, one rounding per stored element.
#include "megatron/ops/checks/sigmoid_gate.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/sigmoid_gate.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int64_t kRowsPerChunk = 256;  // dw's first pass: rows each block sums for its columns

template <class T>
__device__ float warp_dot(const T* a, const T* b, int64_t H, int lane) {
  float dot = 0.0f;
  for (int64_t h = lane; h < H; h += 32) dot = fmaf(to_float(a[h]), to_float(b[h]), dot);
  return warp_reduce(dot, SumOp{});
}

template <class T>
__global__ void forward_kernel(T* y, float* score, const T* out, const T* x, const T* w, int64_t N, int64_t H) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; t < N; t += warps) {
    const float s = 1.0f / (1.0f + expf(-warp_dot(x + t * H, w, H, lane)));
    if (lane == 0) score[t] = s;
    for (int64_t h = lane; h < H; h += 32) y[t * H + h] = from_float<T>(s * to_float(out[t * H + h]));
  }
}

// g[t] = <dy[t], out[t]> s (1 - s); dout[t] = s dy[t]; dx[t] = g[t] w.
template <class T>
__global__ void rows_backward_kernel(T* dout, T* dx, float* g, const T* dy, const T* out, const T* w,
                                     const float* score, int64_t N, int64_t H) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; t < N; t += warps) {
    const float s = score[t];
    const float gt = warp_dot(dy + t * H, out + t * H, H, lane) * s * (1.0f - s);
    if (lane == 0) g[t] = gt;
    for (int64_t h = lane; h < H; h += 32) {
      dout[t * H + h] = from_float<T>(s * to_float(dy[t * H + h]));
      dx[t * H + h] = from_float<T>(gt * to_float(w[h]));
    }
  }
}

// partial[c, h] = sum over the rows of chunk c (blockIdx.y) of g[t] x[t, h], a thread per column.
template <class T>
__global__ void dw_partial_kernel(float* partial, const float* g, const T* x, int64_t N, int64_t H) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  const int64_t first = int64_t(blockIdx.y) * kRowsPerChunk, last = min(N, first + kRowsPerChunk);
  float sum = 0.0f;
  for (int64_t t = first; t < last; ++t) sum = fmaf(g[t], to_float(x[t * H + h]), sum);
  partial[int64_t(blockIdx.y) * H + h] = sum;
}

// dw[h] += the chunks' partials, in chunk order.
__global__ void dw_sum_kernel(float* dw, const float* partial, int64_t chunks, int64_t H) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float sum = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) sum += partial[c * H + h];
  dw[h] += sum;
}

unsigned row_blocks(int64_t N) { return unsigned(std::min(ceil_div(N, int64_t(kWarpsPerBlock)), kMaxGridBlocks)); }

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::sigmoid_gate_forward(Tensor& y, Tensor& score, const Tensor& out, const Tensor& x, const Tensor& w) {
  checks::check_sigmoid_gate_forward(y, score, out, x, w, check_cuda);
  const int64_t N = score.numel(), H = x.dim(-1);
  if (N == 0) return;
  dispatch_storage(x.dtype(), "sigmoid_gate_forward", [&]<class T>(std::type_identity<T>) {
    forward_kernel<T><<<row_blocks(N), kThreads, 0, stream()>>>(
        device_data<T>(y), device_data<float>(score), device_data<T>(out), device_data<T>(x), device_data<T>(w), N, H);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::sigmoid_gate_backward(Tensor& dout, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& out,
                                 const Tensor& x, const Tensor& w, const Tensor& score) {
  checks::check_sigmoid_gate_backward(dout, dx, dw, dy, out, x, w, score, check_cuda);
  const int64_t N = score.numel(), H = x.dim(-1);
  if (N == 0) return;
  const int64_t chunks = ceil_div(N, kRowsPerChunk);
  MEGATRON_CHECK(chunks <= 65535, "sigmoid_gate_backward: " << N << " rows exceed " << 65535 * kRowsPerChunk);
  Tensor g = Tensor::empty({N}, DType::f32, x.device());
  Tensor partial = Tensor::empty({chunks, H}, DType::f32, x.device());
  dispatch_storage(x.dtype(), "sigmoid_gate_backward", [&]<class T>(std::type_identity<T>) {
    rows_backward_kernel<T><<<row_blocks(N), kThreads, 0, stream()>>>(
        device_data<T>(dout), device_data<T>(dx), device_data<float>(g), device_data<T>(dy), device_data<T>(out),
        device_data<T>(w), device_data<float>(score), N, H);
    CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned(ceil_div(H, int64_t(kThreads))), unsigned(chunks));
    dw_partial_kernel<T>
        <<<grid, kThreads, 0, stream()>>>(device_data<float>(partial), device_data<float>(g), device_data<T>(x), N, H);
    CUDA_CHECK_LAUNCH();
  });
  dw_sum_kernel<<<unsigned(ceil_div(H, int64_t(kThreads))), kThreads, 0, stream()>>>(
      device_data<float>(dw), device_data<float>(partial), chunks, H);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops
