// Reductions on CUDA, summed in double like the CPU reference, in two passes without atomics:
// a fixed grid (a function of n alone) writes one partial per block, then one block sums the
// partials in a fixed tree and adds the total to the accumulator. The result is therefore the
// same on every run and every GPU model, so a resumed run reproduces gradient norms bit for bit.
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/reduce.h"

namespace megatron::ops::cuda {
namespace {

constexpr int kVec = 8;             // elements per thread step on the vector path
constexpr int kMaxPartials = 1024;  // blocks of the first pass = threads of the second

struct SquareTerm {
  static constexpr bool kBinary = false;
  __device__ double operator()(float x, float) const { return double(x) * double(x); }
};
struct ProductTerm {
  static constexpr bool kBinary = true;
  __device__ double operator()(float a, float b) const { return double(a) * double(b); }
};
struct NonFiniteTerm {
  static constexpr bool kBinary = false;
  __device__ double operator()(float x, float) const { return isfinite(x) ? 0.0 : 1.0; }
};
struct ZeroTerm {  // every storage dtype's zeros are float zeros
  static constexpr bool kBinary = false;
  __device__ double operator()(float x, float) const { return x == 0.0f ? 1.0 : 0.0; }
};

// partial[block] = sum of term over the block's grid-stride share of [0, n). b is unused (may be
// null) for unary terms.
template <bool kVector, class Term, class T>
__global__ void partial_sums_kernel(double* partial, const T* a, const T* b, int64_t n, Term term) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  double sum = 0.0;
  int64_t done = 0;
  if constexpr (kVector) {
    const int64_t chunks = n / kVec;
    for (int64_t c = tid; c < chunks; c += stride) {
      float va[kVec], vb[kVec];
      load_floats<kVec>(a + c * kVec, va);
      if constexpr (Term::kBinary) load_floats<kVec>(b + c * kVec, vb);
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += term(va[j], Term::kBinary ? vb[j] : 0.0f);
    }
    done = chunks * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) sum += term(to_float(a[i]), Term::kBinary ? to_float(b[i]) : 0.0f);
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// acc[0] += sum of partial[0, count), one block of kMaxPartials threads; Acc float or double.
template <class Acc>
__global__ void finish_kernel(Acc* acc, const double* partial, int count) {
  const double total = block_sum(int(threadIdx.x) < count ? partial[threadIdx.x] : 0.0);
  if (threadIdx.x == 0) acc[0] = Acc(double(acc[0]) + total);
}

template <class Term, class T>
void reduce_into(Tensor& acc, const T* a, const T* b, int64_t n, Term term) {
  const bool vector = is_aligned16(a) && (!Term::kBinary || is_aligned16(b));
  const int blocks = int(std::clamp<int64_t>(ceil_div(n, int64_t(kThreads) * kVec), 1, kMaxPartials));
  Tensor partial = Tensor::empty({blocks}, DType::f64, acc.device());  // from the caching allocator
  auto* p = static_cast<double*>(partial.raw());
  if (vector) {
    partial_sums_kernel<true><<<blocks, kThreads, 0, stream()>>>(p, a, b, n, term);
  } else {
    partial_sums_kernel<false><<<blocks, kThreads, 0, stream()>>>(p, a, b, n, term);
  }
  CUDA_CHECK_LAUNCH();
  if (acc.dtype() == DType::f64) {
    finish_kernel<<<1, kMaxPartials, 0, stream()>>>(static_cast<double*>(acc.raw()), p, blocks);  // check_acc's
  } else {
    finish_kernel<<<1, kMaxPartials, 0, stream()>>>(device_data<float>(acc), p, blocks);
  }
  CUDA_CHECK_LAUNCH();
}

// acc: one f32 element on the same device (f64 inputs are CPU-only); with f64_allowed (exact
// counts) an f64 one too.
void check_acc(const Tensor& acc, const char* name, bool f64_allowed = false) {
  check_cuda(acc, name);
  check_numel(acc, 1, name);
  if (!(f64_allowed && acc.dtype() == DType::f64)) check_dtype(acc, DType::f32, name);
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::sum_squares(Tensor& acc, const Tensor& x) {
  check_cuda(x, "sum_squares x");
  dispatch_storage(x.dtype(), "sum_squares", [&]<class T>(std::type_identity<T>) {
    check_acc(acc, "sum_squares acc");
    reduce_into(acc, device_data<T>(x), static_cast<const T*>(nullptr), x.numel(), SquareTerm{});
  });
}

void cuda::dot(Tensor& acc, const Tensor& a, const Tensor& b) {
  check_cuda(a, "dot a");
  check_cuda(b, "dot b");
  check_numel(b, a.numel(), "dot b");
  check_dtype(b, a.dtype(), "dot b");
  dispatch_storage(a.dtype(), "dot", [&]<class T>(std::type_identity<T>) {
    check_acc(acc, "dot acc");
    reduce_into(acc, device_data<T>(a), device_data<T>(b), a.numel(), ProductTerm{});
  });
}

namespace cuda {
namespace {
// acc += the number of elements of x that `term` counts (1 each); `op` names the op in errors.
template <class Term>
void count_where(Tensor& acc, const Tensor& x, const std::string& op, bool f64_acc, Term term) {
  check_cuda(x, (op + " x").c_str());
  dispatch_storage(x.dtype(), op.c_str(), [&]<class T>(std::type_identity<T>) {
    check_acc(acc, (op + " acc").c_str(), f64_acc);
    reduce_into(acc, device_data<T>(x), static_cast<const T*>(nullptr), x.numel(), term);
  });
}
}  // namespace
}  // namespace cuda

void cuda::count_nonfinite(Tensor& acc, const Tensor& x) {
  count_where(acc, x, "count_nonfinite", false, NonFiniteTerm{});
}

void cuda::count_zeros(Tensor& acc, const Tensor& x) { count_where(acc, x, "count_zeros", true, ZeroTerm{}); }

}  // namespace megatron::ops
