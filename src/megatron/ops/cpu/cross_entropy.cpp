// Softmax cross-entropy on the CPU, one row of V logits per token, in float (double for f64).
// Backward reads each logit once and writes its gradient in the same place, using the lse saved
// by forward, so dlogits may alias logits.
#include "megatron/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

template <class T>
void cross_entropy_forward_kernel(compute_t<T>* losses, compute_t<T>* lse, const T* logits, const int32_t* targets,
                                  int64_t N, int64_t V) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    // lse = m + log sum_v exp(x_v - m), m = max_v x_v;  loss = lse - x_target
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, load(row[j]));
    A sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(load(row[j]) - m);
    const A l = m + std::log(sum);
    lse[n] = l;
    losses[n] = l - load(row[targets[n]]);
  }
}

template <class T, class M>
void cross_entropy_backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const compute_t<T>* lse,
                                   const M* loss_mask, float grad_scale, int64_t N, int64_t V) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * V))
  for (int64_t n = 0; n < N; ++n) {
    // dx_v = (softmax(x)_v - [v == target]) * mask * grad_scale,  softmax(x)_v = exp(x_v - lse)
    const A factor = (loss_mask != nullptr ? A(loss_mask[n]) : A(1)) * A(grad_scale);
    for (int64_t j = 0; j < V; ++j) {
      const A prob = std::exp(load(logits[n * V + j]) - lse[n]);
      const A onehot = j == targets[n] ? A(1) : A(0);
      dlogits[n * V + j] = store<T>((prob - onehot) * factor);
    }
  }
}

// Runs before any parallel loop: an exception must not escape an OpenMP region.
void check_targets(const Tensor& targets, int64_t N, int64_t V) {
  check_cpu(targets, "cross_entropy targets");
  check_shape(targets, {N}, "cross_entropy targets");
  check_dtype(targets, DType::i32, "cross_entropy targets");
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    MEGATRON_CHECK(t[n] >= 0 && t[n] < V, "cross_entropy target " << t[n] << " at row " << n
                                                                  << " is outside the vocabulary [0, " << V
                                                                  << "); check the data and the vocab size");
  }
}

void check_logits(const Tensor& logits, const char* name) {
  check_defined(logits, name);
  check_cpu(logits, name);
  MEGATRON_CHECK(logits.ndim() == 2, name << " must be (N,V), got " << shape_str(logits.shape()));
}

void check_stat(const Tensor& t, int64_t N, DType dtype, const char* name) {
  check_cpu(t, name);
  check_shape(t, {N}, name);
  check_dtype(t, dtype, name);
}

}  // namespace

void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets) {
  check_logits(logits, "cross_entropy logits");
  const int64_t N = logits.dim(0), V = logits.dim(1);
  check_targets(targets, N, V);
  const DType acc = accum_dtype(logits.dtype());
  check_stat(losses, N, acc, "cross_entropy losses");
  check_stat(lse, N, acc, "cross_entropy lse");
  dispatch_floating(logits.dtype(), "cross_entropy_forward", [&]<class T>(std::type_identity<T>) {
    cross_entropy_forward_kernel<T>(losses.data<compute_t<T>>(), lse.data<compute_t<T>>(), logits.data<T>(),
                                    targets.data<int32_t>(), N, V);
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale) {
  check_logits(logits, "cross_entropy logits");
  const int64_t N = logits.dim(0), V = logits.dim(1);
  check_targets(targets, N, V);
  check_stat(lse, N, accum_dtype(logits.dtype()), "cross_entropy lse");
  check_cpu(dlogits, "cross_entropy dlogits");
  check_shape(dlogits, logits.shape(), "cross_entropy dlogits");
  check_dtype(dlogits, logits.dtype(), "cross_entropy dlogits");
  if (loss_mask.defined()) {
    check_cpu(loss_mask, "cross_entropy loss_mask");
    check_shape(loss_mask, {N}, "cross_entropy loss_mask");
    MEGATRON_CHECK(loss_mask.dtype() == DType::f32 || loss_mask.dtype() == DType::f64,
                   "cross_entropy loss_mask has dtype " << dtype_name(loss_mask.dtype()) << ", expected f32 (or f64)");
  }
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    T* dl = dlogits.data<T>();
    const T* l = logits.data<T>();  // may be dl itself
    const int32_t* t = targets.data<int32_t>();
    const compute_t<T>* s = lse.data<compute_t<T>>();
    if (loss_mask.defined() && loss_mask.dtype() == DType::f64) {
      cross_entropy_backward_kernel<T, double>(dl, l, t, s, loss_mask.data<double>(), grad_scale, N, V);
    } else {
      const float* mask = loss_mask.defined() ? loss_mask.data<float>() : nullptr;
      cross_entropy_backward_kernel<T, float>(dl, l, t, s, mask, grad_scale, N, V);
    }
  });
}

}  // namespace megatron::ops::cpu
