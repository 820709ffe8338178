// Softmax cross-entropy on CUDA (whole or vocab-parallel), in float.
//   partial forward: one block per row of V_local logits; each thread keeps an online (max, sum
//             of exp) over its share of the row, read once through 16-byte packs (a row at any
//             offset: scalar head and tail, packed body); the block then merges the pairs. No
//             copy of the logits is made.
//   combine:  one thread per row merges the R ranks' (max, sum of exp, target logit).
//   backward: reads each logit and writes its gradient in the same place, by the same thread,
//             so dlogits may alias logits.
// Targets outside [0, vocab): a kernel cannot raise an error without a host synchronisation, so
// the row gets a NaN loss (and gradient) and the kernel records the target (below); the host
// raises the CPU's error from the record at cross_entropy_check_targets.
#include <cstring>

#include "megatron/ops/checks/cross_entropy.h"
#include "megatron/ops/cross_entropy.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

// ---- the record of out-of-range targets ------------------------------------------------------
// Per device: the lowest row with a bad target, as the key row << 32 | the target's 32 bits
// (atomicMin keeps the lowest; rows < 2^31, check_rows), and the vocabulary of the launch that
// wrote it (every launch between two checks has the same one in practice). Beside it, one flag per
// device in mapped pinned host memory, set by any recording kernel: the host reads it with a plain
// load, so checking costs no copy and no synchronisation while no target was bad; only then does
// the host wait for the device and fetch the record. Nothing is written in the steady state.
constexpr unsigned long long kNoBadTarget = ~0ull;
__device__ unsigned long long bad_target_key = kNoBadTarget;
__device__ long long bad_target_vocab = 0;

__device__ void record_bad_target(int* flag, int64_t row, int64_t target, int64_t vocab) {
  atomicMin(&bad_target_key, (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(target));
  bad_target_vocab = vocab;
  *static_cast<volatile int*>(flag) = 1;  // read by the host after it synchronised with this kernel
}

// This device's flag. One int per device, allocated on first use and kept for the life of the
// process (freeing it at exit would race CUDA's own teardown). Portable and mapped: under unified
// addressing the host pointer is valid on every device.
int* bad_target_flag(int device) {
  struct Flags {
    int* data;
    int devices;
  };
  static const Flags flags = [] {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, sizeof(int) * size_t(n), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p, 0, sizeof(int) * size_t(n));
    return Flags{static_cast<int*>(p), n};
  }();
  MEGATRON_CHECK(device >= 0 && device < flags.devices,
                 "cross_entropy: device cuda:" << device << " is not one of the " << flags.devices << " visible GPUs");
  return flags.data + device;
}

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

// partial[0][n] = m, partial[1][n] = sum exp(x - m), partial[2][n] = x_target or 0 (NaN for a
// target outside the vocabulary, which is recorded).
template <class T>
__global__ void cross_entropy_partial_forward_kernel(float* partial, const T* logits, const int32_t* targets, int64_t N,
                                                     int64_t V, int64_t start, int64_t vocab, int* bad_target) {
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
  // m = max_t m_t;  s = sum_t s_t exp(m_t - m)  (threads without values add 0)
  const float m = block_max(acc.m);
  const float s = block_sum(acc.s == 0.0f ? 0.0f : acc.s * expf(acc.m - m));
  if (threadIdx.x == 0) {
    const int64_t t = targets[n];
    float target_logit = 0.0f;
    if (t < 0 || t >= vocab) {
      target_logit = NAN;
      record_bad_target(bad_target, n, t, vocab);
    } else if (t >= start && t < start + V) {
      target_logit = to_float(row[t - start]);
    }
    partial[n] = m;
    partial[N + n] = s;
    partial[2 * N + n] = target_logit;
  }
}

// lse = M + log sum_r s_r exp(m_r - M), M = max_r m_r;  loss = lse - sum_r t_r.
__global__ void cross_entropy_combine_kernel(float* losses, float* lse, const float* partials, int64_t N, int64_t R) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float M = -INFINITY;
  for (int64_t r = 0; r < R; ++r) M = fmaxf(M, partials[(r * 3) * N + n]);
  float s = 0.0f, t = 0.0f;
  for (int64_t r = 0; r < R; ++r) {
    s += partials[(r * 3 + 1) * N + n] * expf(partials[(r * 3) * N + n] - M);
    t += partials[(r * 3 + 2) * N + n];
  }
  const float l = M + logf(s);
  lse[n] = l;
  losses[n] = l - t;
}

// dx_v = (exp(x_v - lse) - [v == target]) * mask * grad_scale; dl may be l.
__device__ __forceinline__ float ce_grad(float x, int64_t v, float l, int64_t target, float factor) {
  return (expf(x - l) - (v == target ? 1.0f : 0.0f)) * factor;
}

template <bool kVector, class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                              const float* loss_mask, float grad_scale, int64_t V, int64_t start,
                                              int64_t vocab, int* bad_target) {
  constexpr int kVec = kPack<T>;
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  T* dx = dlogits + n * V;
  const int64_t target = targets[n];
  const int64_t t = target - start;  // outside [0, V): another rank's column
  const float l = lse[n];
  float factor = (loss_mask != nullptr ? loss_mask[n] : 1.0f) * grad_scale;
  if (target < 0 || target >= vocab) {
    factor = NAN;
    if (threadIdx.x == 0) record_bad_target(bad_target, n, target, vocab);
  }
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

void check_cuda_logits_dtype(const Tensor& logits, const char* op) {
  dispatch_storage(logits.dtype(), op, [](auto) {});
}

constexpr checks::CrossEntropyBackend kCudaCrossEntropy{check_cuda, check_cuda_logits_dtype};

// One block per row: rows beyond the grid's x limit would need a second dimension.
void check_rows(int64_t N) {
  MEGATRON_CHECK(N <= int64_t(0x7fffffff), "cross_entropy: " << N << " rows exceed one launch; split the batch");
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::cross_entropy_partial_forward(Tensor& partial, const Tensor& logits, const Tensor& targets,
                                         const VocabShard& shard) {
  const auto [N, V, vocab] =
      checks::check_cross_entropy_partial_forward(partial, logits, targets, shard, kCudaCrossEntropy);
  check_rows(N);
  if (N == 0) return;
  dispatch_storage(logits.dtype(), "cross_entropy_partial_forward", [&]<class T>(std::type_identity<T>) {
    cross_entropy_partial_forward_kernel<T><<<unsigned(N), kThreads, 0, stream()>>>(
        device_data<float>(partial), device_data<T>(logits), device_data<int32_t>(targets), N, V, shard.start, vocab,
        bad_target_flag(logits.device().index));
    CUDA_CHECK_LAUNCH();
  });
}

void cuda::cross_entropy_combine(Tensor& losses, Tensor& lse, const Tensor& partials) {
  const auto [N, R] = checks::check_cross_entropy_combine(losses, lse, partials, check_cuda);
  MEGATRON_CHECK(partials.dtype() == DType::f32,
                 "cross_entropy partials have dtype " << dtype_name(partials.dtype()) << "; CUDA takes f32");
  if (N == 0) return;
  cross_entropy_combine_kernel<<<grid_for(N), kThreads, 0, stream()>>>(
      device_data<float>(losses), device_data<float>(lse), device_data<float>(partials), N, R);
  CUDA_CHECK_LAUNCH();
}

void cuda::cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                  const Tensor& loss_mask, float grad_scale, const VocabShard& shard) {
  const auto [N, V, vocab] =
      checks::check_cross_entropy_backward(dlogits, logits, targets, lse, loss_mask, shard, kCudaCrossEntropy);
  check_rows(N);
  if (N == 0) return;
  dispatch_storage(logits.dtype(), "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    T* dl = device_data<T>(dlogits);
    const T* l = device_data<T>(logits);  // may be dl itself
    const float* mask = loss_mask.defined() ? device_data<float>(loss_mask) : nullptr;
    const bool same_phase = (reinterpret_cast<uintptr_t>(dl) - reinterpret_cast<uintptr_t>(l)) % kVecBytes == 0;
    int* bad_target = bad_target_flag(logits.device().index);
    auto launch = [&](auto kernel) {
      kernel<<<unsigned(N), kThreads, 0, stream()>>>(dl, l, device_data<int32_t>(targets), device_data<float>(lse),
                                                     mask, grad_scale, V, shard.start, vocab, bad_target);
      CUDA_CHECK_LAUNCH();
    };
    same_phase ? launch(cross_entropy_backward_kernel<true, T>) : launch(cross_entropy_backward_kernel<false, T>);
  });
}

void cuda::cross_entropy_check_targets(Device device) {
  MEGATRON_CHECK(device.is_cuda(), "cross_entropy_check_targets: " << device.str() << " is not a GPU");
  volatile int* flag = bad_target_flag(device.index);
  if (*flag == 0) return;
  // A kernel recorded a bad target: wait for any still running, then read and clear the record.
  const int current = megatron::cuda::current_context().device();
  MEGATRON_CHECK(device.index == current, "cross_entropy_check_targets: asked about cuda:"
                                              << device.index << " but the current device is cuda:" << current
                                              << "; one process drives one GPU (init_device)");
  CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long key = kNoBadTarget;
  long long vocab = 0;
  CUDA_CHECK(cudaMemcpyFromSymbol(&key, bad_target_key, sizeof(key)));
  CUDA_CHECK(cudaMemcpyFromSymbol(&vocab, bad_target_vocab, sizeof(vocab)));
  CUDA_CHECK(cudaMemcpyToSymbol(bad_target_key, &kNoBadTarget, sizeof(kNoBadTarget)));
  *flag = 0;
  checks::fail_target_outside_vocabulary(static_cast<int32_t>(static_cast<uint32_t>(key)), int64_t(key >> 32), vocab);
}

}  // namespace megatron::ops
