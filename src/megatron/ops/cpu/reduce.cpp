// Reductions on the CPU, summed in double over fixed blocks: the result does not depend on the
// number of OpenMP threads, so a resumed run reproduces gradient norms bit for bit.
#include "megatron/ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

// sum_{i < n} term(i) in double: per-block partial sums in parallel, then the blocks in order.
template <class F>
double blocked_sum(int64_t n, const F& term) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double s = 0.0;
    const int64_t end = std::min(n, (blk + 1) * kBlock);
    for (int64_t i = blk * kBlock; i < end; ++i) s += term(i);
    partial[size_t(blk)] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

// acc: one element, f32, or f64 for f64 inputs.
void check_acc(const Tensor& acc, DType input, const char* name) {
  check_cpu(acc, name);
  check_numel(acc, 1, name);
  check_dtype(acc, accum_dtype(input), name);
}

void accumulate(Tensor& acc, double value) {
  if (acc.dtype() == DType::f64) {
    acc.data<double>()[0] += value;
  } else {
    acc.data<float>()[0] = float(double(acc.data<float>()[0]) + value);
  }
}

void check_input(const Tensor& x, const char* name) {
  check_defined(x, name);
  check_cpu(x, name);
}

// acc += the number of elements of x for which `counted(value)` holds; `op` names the op in errors.
// f64_acc: an f64 accumulator is taken whatever x's dtype (exact counts).
template <class Predicate>
void count_where(Tensor& acc, const Tensor& x, const char* op, bool f64_acc, Predicate counted) {
  check_input(x, (std::string(op) + " x").c_str());
  check_acc(acc, f64_acc && acc.dtype() == DType::f64 ? DType::f64 : x.dtype(), (std::string(op) + " acc").c_str());
  double total = 0.0;
  dispatch_floating(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    const T* p = x.data<T>();
    total = blocked_sum(x.numel(), [p, counted](int64_t i) { return counted(double(load(p[i]))) ? 1.0 : 0.0; });
  });
  accumulate(acc, total);
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::sum_squares(Tensor& acc, const Tensor& x) {
  check_input(x, "sum_squares x");
  check_acc(acc, x.dtype(), "sum_squares acc");
  double total = 0.0;
  dispatch_floating(x.dtype(), "sum_squares", [&]<class T>(std::type_identity<T>) {
    const T* p = x.data<T>();
    total = blocked_sum(x.numel(), [p](int64_t i) {
      const double v = double(load(p[i]));
      return v * v;
    });
  });
  accumulate(acc, total);
}

void cpu::dot(Tensor& acc, const Tensor& a, const Tensor& b) {
  check_input(a, "dot a");
  check_input(b, "dot b");
  check_numel(b, a.numel(), "dot b");
  check_dtype(b, a.dtype(), "dot b");
  check_acc(acc, a.dtype(), "dot acc");
  double total = 0.0;
  dispatch_floating(a.dtype(), "dot", [&]<class T>(std::type_identity<T>) {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    total = blocked_sum(a.numel(), [pa, pb](int64_t i) { return double(load(pa[i])) * double(load(pb[i])); });
  });
  accumulate(acc, total);
}

void cpu::count_nonfinite(Tensor& acc, const Tensor& x) {
  count_where(acc, x, "count_nonfinite", false, [](double v) { return !std::isfinite(v); });
}

void cpu::count_zeros(Tensor& acc, const Tensor& x) {
  count_where(acc, x, "count_zeros", true, [](double v) { return v == 0.0; });
}

}  // namespace megatron::ops
