// Softmax cross-entropy on CUDA, one block per row of V logits, in float.
//   forward:  each thread keeps an online (max, sum of exp) over its share of the row, read once
//             through 16-byte packs (a row at any offset: scalar head and tail, packed body);
//             the block then merges the pairs. No copy of the logits is made.
//   backward: reads each logit and writes its gradient in the same place, by the same thread,
//             so dlogits may alias logits.
// Targets outside [0, V) cannot raise an error from a kernel without a host synchronisation; they
// give a NaN loss (and a NaN gradient row), which the loss and grad-norm checks report.
#include "megatron/ops/cross_entropy.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

// Running (max m, sum s of exp(x - m)) over the values seen so far.
struct OnlineSoftmax {
  float m = -INFINITY;
  float s = 0.0f;
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.0f;  // the first value: 0 * exp(-inf) + 1
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  template <int N>
  __device__ __forceinline__ void add_pack(const float (&v)[N]) {
    float pack_max = v[0];
#pragma unroll
    for (int j = 1; j < N; ++j) pack_max = fmaxf(pack_max, v[j]);
    if (pack_max > m) {  // rescale once per pack rather than once per element
      s *= expf(m - pack_max);
      m = pack_max;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) s += expf(v[j] - m);
  }
};

template <class T>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                             int64_t V) {
  constexpr int kVec = kPack<T>;
  const int64_t n = blockIdx.x;
  const T* row = logits + n * V;
  const AlignedSpan span = aligned_span(row, V);
  OnlineSoftmax acc;
  for (int64_t j = threadIdx.x; j < span.head; j += blockDim.x) acc.add(to_float(row[j]));
  for (int64_t p = threadIdx.x; p < span.packs; p += blockDim.x) {
    float v[kVec];
    load_floats<kVec>(row + span.head + p * kVec, v);
    acc.add_pack(v);
  }
  for (int64_t j = span.head + span.packs * kVec + threadIdx.x; j < V; j += blockDim.x) acc.add(to_float(row[j]));
  // lse = M + log sum_threads s_t exp(m_t - M), M = max_t m_t  (threads without values add 0)
  const float m = block_max(acc.m);
  const float s = block_sum(acc.s == 0.0f ? 0.0f : acc.s * expf(acc.m - m));
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    const int32_t t = targets[n];
    lse[n] = l;
    losses[n] = (t >= 0 && t < V) ? l - to_float(row[t]) : NAN;
  }
}

// dx_v = (exp(x_v - lse) - [v == target]) * mask * grad_scale; dl may be l.
__device__ __forceinline__ float ce_grad(float x, int64_t v, float l, int64_t target, float factor) {
  return (expf(x - l) - (v == target ? 1.0f : 0.0f)) * factor;
}

template <bool kVector, class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                              const float* loss_mask, float grad_scale, int64_t V) {
  constexpr int kVec = kPack<T>;
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  T* dx = dlogits + n * V;
  const int64_t t = targets[n];
  const float l = lse[n];
  float factor = (loss_mask != nullptr ? loss_mask[n] : 1.0f) * grad_scale;
  if (t < 0 || t >= V) factor = NAN;
  AlignedSpan span{V, 0};  // all scalar unless dx and x share their 16-byte phase
  if constexpr (kVector) span = aligned_span(x, V);
  for (int64_t j = threadIdx.x; j < span.head; j += blockDim.x)
    dx[j] = from_float<T>(ce_grad(to_float(x[j]), j, l, t, factor));
  for (int64_t p = threadIdx.x; p < span.packs; p += blockDim.x) {
    const int64_t j0 = span.head + p * kVec;
    float v[kVec];
    load_floats<kVec>(x + j0, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = ce_grad(v[i], j0 + i, l, t, factor);
    store_floats<kVec>(dx + j0, v);
  }
  for (int64_t j = span.head + span.packs * kVec + threadIdx.x; j < V; j += blockDim.x) {
    dx[j] = from_float<T>(ce_grad(to_float(x[j]), j, l, t, factor));
  }
}

void check_logits(const Tensor& logits, const char* name) {
  check_cuda(logits, name);
  MEGATRON_CHECK(logits.ndim() == 2, name << " must be (N,V), got " << shape_str(logits.shape()));
}

void check_targets(const Tensor& targets, int64_t N) {
  check_cuda(targets, "cross_entropy targets");
  check_shape(targets, {N}, "cross_entropy targets");
  check_dtype(targets, DType::i32, "cross_entropy targets");
}

void check_stat(const Tensor& t, int64_t N, const char* name) {
  check_cuda(t, name);
  check_shape(t, {N}, name);
  check_dtype(t, DType::f32, name);
}

// One block per row: rows beyond the grid's x limit would need a second dimension.
void check_rows(int64_t N) {
  MEGATRON_CHECK(N <= int64_t(0x7fffffff), "cross_entropy: " << N << " rows exceed one launch; split the batch");
}

}  // namespace

void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets) {
  check_logits(logits, "cross_entropy logits");
  const int64_t N = logits.dim(0), V = logits.dim(1);
  check_targets(targets, N);
  dispatch_storage(logits.dtype(), "cross_entropy_forward", [&]<class T>(std::type_identity<T>) {
    check_stat(losses, N, "cross_entropy losses");
    check_stat(lse, N, "cross_entropy lse");
    check_rows(N);
    MEGATRON_CHECK(V > 0, "cross_entropy logits " << shape_str(logits.shape()) << " have an empty vocabulary");
    if (N == 0) return;
    cross_entropy_forward_kernel<T><<<unsigned(N), kThreads, 0, stream()>>>(
        device_data<float>(losses), device_data<float>(lse), device_data<T>(logits), device_data<int32_t>(targets), V);
    CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale) {
  check_logits(logits, "cross_entropy logits");
  const int64_t N = logits.dim(0), V = logits.dim(1);
  check_targets(targets, N);
  check_cuda(dlogits, "cross_entropy dlogits");
  check_shape(dlogits, logits.shape(), "cross_entropy dlogits");
  check_dtype(dlogits, logits.dtype(), "cross_entropy dlogits");
  if (loss_mask.defined()) {
    check_cuda(loss_mask, "cross_entropy loss_mask");
    check_shape(loss_mask, {N}, "cross_entropy loss_mask");
    check_dtype(loss_mask, DType::f32, "cross_entropy loss_mask");
  }
  dispatch_storage(logits.dtype(), "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    check_stat(lse, N, "cross_entropy lse");
    check_rows(N);
    if (N == 0 || V == 0) return;
    T* dl = device_data<T>(dlogits);
    const T* l = device_data<T>(logits);  // may be dl itself
    const float* mask = loss_mask.defined() ? device_data<float>(loss_mask) : nullptr;
    const bool same_phase = (reinterpret_cast<uintptr_t>(dl) - reinterpret_cast<uintptr_t>(l)) % kVecBytes == 0;
    auto launch = [&](auto kernel) {
      kernel<<<unsigned(N), kThreads, 0, stream()>>>(dl, l, device_data<int32_t>(targets), device_data<float>(lse),
                                                     mask, grad_scale, V);
      CUDA_CHECK_LAUNCH();
    };
    same_phase ? launch(cross_entropy_backward_kernel<true, T>) : launch(cross_entropy_backward_kernel<false, T>);
  });
}

}  // namespace megatron::ops::cuda
