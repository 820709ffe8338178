// MoE routing on CUDA: one thread per token runs moe_routing_token.h (the CPU's arithmetic); the
// sums are one block per entry, each thread summing a fixed stride of tokens and the block
// reducing in a fixed tree (deterministic; the order differs from the CPU's running sum only).
// The plan: one block per expert ranks its tokens in order (a block scan), one thread turns the
// counts into offsets, and one thread per (token, expert) writes the rows. Nothing is read back
// to the host.
#include <cub/block/block_scan.cuh>

#include "megatron/ops/checks/moe_routing.h"
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/moe_routing.h"
#include "megatron/ops/moe_routing_token.h"

namespace megatron::ops::cuda {
namespace {

namespace detail = moe_routing_detail;

template <class T>
__global__ void route_kernel(T* probs, int32_t* topk, double* contribution, const T* logits, const T* bias, int64_t T_,
                             int64_t E, TopKRouting p) {
  const int64_t C = detail::contribution_size(E);
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x)
    detail::route_token(logits + t * E, bias, E, p, probs + t * E, topk + t * p.topk, contribution + t * C);
}

// Block j: sums entry j over its tokens.
__global__ void sums_kernel(double* sums, const double* contribution, int64_t T_, int64_t E, int64_t B) {
  const detail::SumSource src = detail::sum_source(blockIdx.x, E, B);
  const int64_t C = detail::contribution_size(E);
  const int64_t first = src.sequence < 0 ? 0 : src.sequence, step = src.sequence < 0 ? 1 : B;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; first + i * step < T_; i += blockDim.x) sum += contribution[(first + i * step) * C + src.column];
  sum = block_sum(sum);
  if (threadIdx.x == 0) sums[blockIdx.x] = sum;
}

// Block e: the rank of each token among expert e's tokens (token_rows, -1 where t does not go to
// e) and e's count (counts[e]).
constexpr int kScanThreads = 256;
__global__ void rank_kernel(int32_t* token_rows, int32_t* counts, const int32_t* topk, int64_t T_, int64_t E,
                            int64_t k) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int32_t e = int32_t(blockIdx.x);
  int base = 0;
  for (int64_t t0 = 0; t0 < T_; t0 += kScanThreads) {
    const int64_t t = t0 + threadIdx.x;
    int routed = 0;
    if (t < T_)
      for (int64_t j = 0; j < k; ++j) routed |= topk[t * k + j] == e;
    int rank = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(routed, rank, total);
    if (t < T_) token_rows[t * E + e] = routed ? base + rank : -1;
    base += total;
    __syncthreads();  // scan_storage is reused
  }
  if (threadIdx.x == 0) counts[e] = base;
}

// offsets (E+1): offsets[e+1] holds e's count on entry; the running sum in place.
__global__ void offsets_kernel(int32_t* offsets, int64_t E) {
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
}

template <class T>
__global__ void scatter_kernel(int32_t* row_token, T* row_prob, int32_t* token_rows, const int32_t* offsets,
                               const T* probs, int64_t T_, int64_t E) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T_ * E; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t rank = token_rows[i];
    if (rank < 0) continue;
    const int32_t row = offsets[i % E] + rank;
    token_rows[i] = row;
    row_token[row] = int32_t(i / E);
    row_prob[row] = probs[i];
  }
}

template <class V>
__global__ void losses_kernel(V* values, const double* sums, int64_t E, TopKRouting p) {
  const int64_t B = p.balancing_sequences;
  const double all_tokens = sums[0];
  double balancing = 0.0;
  if (B > 0) {
    const double norm = detail::balancing_norm(all_tokens, E, p);
    const double* f = sums + 1 + E;
    for (int64_t i = 0; i < B * E; ++i) balancing += norm * f[i] * f[B * E + i];
  }
  values[0] = V(balancing);
  values[1] = V(p.z_loss ? sums[1 + E + 2 * B * E] / all_tokens : 0.0);
  for (int64_t e = 0; e < E; ++e) values[2 + e] = V(sums[1 + e]);
}

template <class T>
__global__ void backward_kernel(T* dlogits, const T* dprobs, const T* logits, const int32_t* topk, const double* sums,
                                int64_t T_, int64_t E, TopKRouting p, double aux_loss_weight, double z_loss_weight) {
  const int64_t B = p.balancing_sequences;
  const double norm = B > 0 ? detail::balancing_norm(sums[0], E, p) : 0.0;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x)
    detail::route_token_backward(logits + t * E, dprobs + t * E, topk + t * p.topk,
                                 B > 0 ? sums + 1 + E + (t % B) * E : nullptr, norm, E, p, aux_loss_weight,
                                 z_loss_weight, sums[0], dlogits + t * E);
}

template <class T>
T* data_of(Tensor& t) {
  return static_cast<T*>(t.raw());
}
template <class T>
const T* data_of(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}

// Threads per block of the per-token kernels: a token's work arrays live in registers and local
// memory, so smaller blocks spread the tokens over more multiprocessors.
constexpr int kTokenThreads = 128;

}  // namespace
}  // namespace megatron::ops::cuda

namespace megatron::ops {

void cuda::moe_route(Tensor& probs, Tensor& topk_experts, Tensor& sums, const Tensor& logits, const Tensor& expert_bias,
                     const TopKRouting& routing) {
  checks::check_moe_route(probs, topk_experts, sums, logits, expert_bias, routing, check_cuda);
  const int64_t T_ = logits.dim(0), E = logits.dim(1);
  if (T_ == 0) {
    sums.zero();
    return;
  }
  Tensor contribution = Tensor::empty({T_, detail::contribution_size(E)}, DType::f64, logits.device());
  detail::dispatch_router(logits.dtype(), [&]<class T>(std::type_identity<T>) {
    route_kernel<T><<<grid_for(T_, kTokenThreads), kTokenThreads, 0, stream()>>>(
        data_of<T>(probs), data_of<int32_t>(topk_experts), data_of<double>(contribution), data_of<T>(logits),
        expert_bias.defined() ? data_of<T>(expert_bias) : nullptr, T_, E, routing);
    CUDA_CHECK_LAUNCH();
  });
  sums_kernel<<<unsigned(sums.numel()), kThreads, 0, stream()>>>(data_of<double>(sums), data_of<double>(contribution),
                                                                  T_, E, routing.balancing_sequences);
  CUDA_CHECK_LAUNCH();
}

void cuda::moe_route_plan(Tensor& row_token, Tensor& row_prob, Tensor& token_rows, Tensor& expert_offsets,
                          const Tensor& topk_experts, const Tensor& probs) {
  checks::check_moe_route_plan(row_token, row_prob, token_rows, expert_offsets, topk_experts, probs, check_cuda);
  const int64_t T_ = probs.dim(0), E = probs.dim(1);
  rank_kernel<<<unsigned(E), kScanThreads, 0, stream()>>>(data_of<int32_t>(token_rows),
                                                          data_of<int32_t>(expert_offsets) + 1,
                                                          data_of<int32_t>(topk_experts), T_, E, topk_experts.dim(1));
  CUDA_CHECK_LAUNCH();
  offsets_kernel<<<1, 1, 0, stream()>>>(data_of<int32_t>(expert_offsets), E);
  CUDA_CHECK_LAUNCH();
  if (T_ == 0) return;
  detail::dispatch_router(probs.dtype(), [&]<class T>(std::type_identity<T>) {
    scatter_kernel<T><<<grid_for(T_ * E), kThreads, 0, stream()>>>(
        data_of<int32_t>(row_token), data_of<T>(row_prob), data_of<int32_t>(token_rows),
        data_of<int32_t>(expert_offsets), data_of<T>(probs), T_, E);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_route_losses(Tensor& values, const Tensor& sums, const TopKRouting& routing) {
  checks::check_moe_route_losses(values, sums, routing, check_cuda);
  detail::dispatch_router(values.dtype(), [&]<class V>(std::type_identity<V>) {
    losses_kernel<V><<<1, 1, 0, stream()>>>(data_of<V>(values), data_of<double>(sums), values.numel() - 2, routing);
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::moe_route_backward(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& topk_experts,
                              const Tensor& sums, const TopKRouting& routing, double aux_loss_weight,
                              double z_loss_weight) {
  checks::check_moe_route_backward(dlogits, dprobs, logits, topk_experts, sums, routing, check_cuda);
  const int64_t T_ = logits.dim(0), E = logits.dim(1);
  if (T_ == 0) return;
  detail::dispatch_router(logits.dtype(), [&]<class T>(std::type_identity<T>) {
    backward_kernel<T><<<grid_for(T_, kTokenThreads), kTokenThreads, 0, stream()>>>(
        data_of<T>(dlogits), data_of<T>(dprobs), data_of<T>(logits), data_of<int32_t>(topk_experts),
        data_of<double>(sums), T_, E, routing, aux_loss_weight, z_loss_weight);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
