// The grouped GEMM on the CPU: the readable reference, plain loops over each expert's rows with
// compute_t accumulation (float, or double for f64) and one rounding per stored element; the
// weight gradient accumulates into the main grad in its own dtype.
#include "megatron/ops/checks/grouped_gemm.h"

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/grouped_gemm.h"

namespace megatron::ops::cpu {
namespace {

// The expert owning each row.
std::vector<int64_t> row_experts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> expert;
  for (size_t e = 0; e < counts.size(); ++e) expert.insert(expert.end(), size_t(counts[e]), int64_t(e));
  return expert;
}

template <class T>
void forward_kernel(T* y, const T* x, const T* w, const std::vector<int64_t>& expert, int64_t in, int64_t out) {
  const auto N = int64_t(expert.size());
#pragma omp parallel for if (worth_parallel(N * in * out))
  for (int64_t r = 0; r < N; ++r) {
    const T* w_e = w + expert[size_t(r)] * out * in;
    for (int64_t o = 0; o < out; ++o) {
      compute_t<T> sum = 0;  // y[r,o] = sum_i x[r,i] W_e[o,i]
      for (int64_t i = 0; i < in; ++i) sum += load(x[r * in + i]) * load(w_e[o * in + i]);
      y[r * out + o] = store<T>(sum);
    }
  }
}

template <class T>
void dx_kernel(T* dx, const T* dy, const T* w, const std::vector<int64_t>& expert, int64_t in, int64_t out) {
  const auto N = int64_t(expert.size());
#pragma omp parallel for if (worth_parallel(N * in * out))
  for (int64_t r = 0; r < N; ++r) {
    const T* w_e = w + expert[size_t(r)] * out * in;
    for (int64_t i = 0; i < in; ++i) {
      compute_t<T> sum = 0;  // dx[r,i] = sum_o dy[r,o] W_e[o,i]
      for (int64_t o = 0; o < out; ++o) sum += load(dy[r * out + o]) * load(w_e[o * in + i]);
      dx[r * in + i] = store<T>(sum);
    }
  }
}

template <class T>
void dw_kernel(compute_t<T>* dw, const T* dy, const T* x, const std::vector<int64_t>& counts, int64_t in, int64_t out) {
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); begin += counts[e], ++e) {
    compute_t<T>* dw_e = dw + int64_t(e) * out * in;
#pragma omp parallel for if (worth_parallel(counts[e] * in * out))
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        compute_t<T> sum = 0;  // dW_e[o,i] += sum over e's rows of dy[r,o] x[r,i]
        for (int64_t r = begin; r < begin + counts[e]; ++r) sum += load(dy[r * out + o]) * load(x[r * in + i]);
        dw_e[o * in + i] += sum;
      }
    }
  }
}

}  // namespace
}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::grouped_linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const ExpertRows& rows) {
  checks::check_grouped_linear_forward(y, x, weight, rows, check_cpu);
  const std::vector<int64_t> counts = rows.host_counts();
  dispatch_floating(x.dtype(), "grouped_linear_forward", [&]<class T>(std::type_identity<T>) {
    forward_kernel<T>(y.data<T>(), x.data<T>(), weight.data<T>(), row_experts(counts), x.dim(1), weight.dim(1));
  });
}

void cpu::grouped_linear_backward(Tensor& dx, Tensor& dweight, const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const ExpertRows& rows, GradWrite dweight_write) {
  checks::check_grouped_linear_backward(dx, dweight, dy, x, weight, rows, check_cpu);
  if (dweight.defined() && dweight_write == GradWrite::overwrite) dweight.zero();
  const std::vector<int64_t> counts = rows.host_counts();
  dispatch_floating(x.dtype(), "grouped_linear_backward", [&]<class T>(std::type_identity<T>) {
    if (dx.defined())
      dx_kernel<T>(dx.data<T>(), dy.data<T>(), weight.data<T>(), row_experts(counts), x.dim(1), weight.dim(1));
    if (dweight.defined())
      dw_kernel<T>(dweight.data<compute_t<T>>(), dy.data<T>(), x.data<T>(), counts, x.dim(1), weight.dim(1));
  });
}

}  // namespace megatron::ops
