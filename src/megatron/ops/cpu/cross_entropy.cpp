// Softmax cross-entropy on the CPU, one row of V_local logits per token, in float (double for
// f64). Backward reads each logit once and writes its gradient in the same place, using the lse
// saved by forward, so dlogits may alias logits.
#include "megatron/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "megatron/ops/checks/cross_entropy.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

template <class T>
void partial_forward_kernel(compute_t<T>* partial, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                            int64_t start) {
  using A = compute_t<T>;
  A* max = partial;
  A* sum_exp = partial + N;
  A* target_logit = partial + 2 * N;
#pragma omp parallel for if (worth_parallel(N * V))
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    // m = max_v x_v;  s = sum_v exp(x_v - m);  t = x_target when this shard holds the target
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, load(row[j]));
    A s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(load(row[j]) - m);
    const int64_t t = int64_t(targets[n]) - start;
    max[n] = m;
    sum_exp[n] = s;
    target_logit[n] = t >= 0 && t < V ? load(row[t]) : A(0);
  }
}

template <class A>
void combine_kernel(A* losses, A* lse, const A* partials, int64_t N, int64_t R) {
  for (int64_t n = 0; n < N; ++n) {
    // M = max_r m_r;  lse = M + log sum_r s_r exp(m_r - M);  loss = lse - sum_r t_r
    A M = -std::numeric_limits<A>::infinity();
    for (int64_t r = 0; r < R; ++r) M = std::max(M, partials[(r * 3 + 0) * N + n]);
    A s = 0, t = 0;
    for (int64_t r = 0; r < R; ++r) {
      s += partials[(r * 3 + 1) * N + n] * std::exp(partials[(r * 3 + 0) * N + n] - M);
      t += partials[(r * 3 + 2) * N + n];
    }
    lse[n] = M + std::log(s);
    losses[n] = lse[n] - t;
  }
}

template <class T, class M>
void backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const compute_t<T>* lse, const M* loss_mask,
                     float grad_scale, int64_t N, int64_t V, int64_t start) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * V))
  for (int64_t n = 0; n < N; ++n) {
    // dx_v = (softmax(x)_v - [v == target]) * mask * grad_scale,  softmax(x)_v = exp(x_v - lse)
    const A factor = (loss_mask != nullptr ? A(loss_mask[n]) : A(1)) * A(grad_scale);
    const int64_t target = int64_t(targets[n]) - start;  // outside [0, V): another rank's column
    for (int64_t j = 0; j < V; ++j) {
      const A prob = std::exp(load(logits[n * V + j]) - lse[n]);
      const A onehot = j == target ? A(1) : A(0);
      dlogits[n * V + j] = store<T>((prob - onehot) * factor);
    }
  }
}

// Runs before any parallel loop: an exception must not escape an OpenMP region.
void check_target_values(const Tensor& targets, int64_t vocab) {
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < targets.numel(); ++n) {
    if (t[n] < 0 || t[n] >= vocab) checks::fail_target_outside_vocabulary(t[n], n, vocab);
  }
}

void check_cpu_logits_dtype(const Tensor& logits, const char* op) {
  dispatch_floating(logits.dtype(), op, [](auto) {});
}

constexpr checks::CrossEntropyBackend kCpuCrossEntropy{check_cpu, check_cpu_logits_dtype};

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::cross_entropy_partial_forward(Tensor& partial, const Tensor& logits, const Tensor& targets,
                                        const VocabShard& shard) {
  const auto [N, V, vocab] =
      checks::check_cross_entropy_partial_forward(partial, logits, targets, shard, kCpuCrossEntropy);
  check_target_values(targets, vocab);
  dispatch_floating(logits.dtype(), "cross_entropy_partial_forward", [&]<class T>(std::type_identity<T>) {
    partial_forward_kernel<T>(partial.data<compute_t<T>>(), logits.data<T>(), targets.data<int32_t>(), N, V,
                              shard.start);
  });
}

void cpu::cross_entropy_combine(Tensor& losses, Tensor& lse, const Tensor& partials) {
  const auto [N, R] = checks::check_cross_entropy_combine(losses, lse, partials, check_cpu);
  if (partials.dtype() == DType::f64) {
    combine_kernel<double>(losses.data<double>(), lse.data<double>(), partials.data<double>(), N, R);
  } else {
    combine_kernel<float>(losses.data<float>(), lse.data<float>(), partials.data<float>(), N, R);
  }
}

void cpu::cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& loss_mask, float grad_scale, const VocabShard& shard) {
  const auto [N, V, vocab] =
      checks::check_cross_entropy_backward(dlogits, logits, targets, lse, loss_mask, shard, kCpuCrossEntropy);
  check_target_values(targets, vocab);
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    T* dl = dlogits.data<T>();
    const T* l = logits.data<T>();  // may be dl itself
    const int32_t* t = targets.data<int32_t>();
    const compute_t<T>* s = lse.data<compute_t<T>>();
    if (loss_mask.defined() && loss_mask.dtype() == DType::f64) {
      backward_kernel<T, double>(dl, l, t, s, loss_mask.data<double>(), grad_scale, N, V, shard.start);
    } else {
      const float* mask = loss_mask.defined() ? loss_mask.data<float>() : nullptr;
      backward_kernel<T, float>(dl, l, t, s, mask, grad_scale, N, V, shard.start);
    }
  });
}

}  // namespace megatron::ops
