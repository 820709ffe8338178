// Elementwise and layout ops on the CPU. Where the output and input dtypes may differ, the
// arithmetic runs in the wider of the two compute types (double when either side is f64).
#include "megatron/ops/elementwise.h"

#include <cstring>
#include <type_traits>

#include "megatron/ops/checks/elementwise.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

template <class O, class I>
using wide_t = std::common_type_t<compute_t<O>, compute_t<I>>;

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::add(Tensor& out, const Tensor& a, const Tensor& b) {
  checks::check_add(out, a, b, check_cpu);
  dispatch_floating(a.dtype(), "add", [&]<class T>(std::type_identity<T>) {
    T* o = out.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    const int64_t n = out.numel();
#pragma omp parallel for if (worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) o[i] = store<T>(load(pa[i]) + load(pb[i]));  // in place is fine
  });
}

void cpu::add_scaled(Tensor& out, const Tensor& x, float alpha) {
  checks::check_same_numel(out, x, "add_scaled out", "add_scaled x", check_cpu);
  dispatch_floating(out.dtype(), "add_scaled", [&]<class O>(std::type_identity<O>) {
    dispatch_floating(x.dtype(), "add_scaled", [&]<class I>(std::type_identity<I>) {
      using A = wide_t<O, I>;
      O* o = out.data<O>();
      const I* px = x.data<I>();
      const int64_t n = out.numel();
#pragma omp parallel for if (worth_parallel(n))
      for (int64_t i = 0; i < n; ++i) o[i] = store<O>(compute_t<O>(A(load(o[i])) + A(alpha) * A(load(px[i]))));
    });
  });
}

void cpu::scale(Tensor& out, const Tensor& x, float alpha) {
  checks::check_same_numel(out, x, "scale out", "scale x", check_cpu);
  dispatch_floating(out.dtype(), "scale", [&]<class O>(std::type_identity<O>) {
    dispatch_floating(x.dtype(), "scale", [&]<class I>(std::type_identity<I>) {
      using A = wide_t<O, I>;
      O* o = out.data<O>();
      const I* px = x.data<I>();
      const int64_t n = out.numel();
#pragma omp parallel for if (worth_parallel(n))
      for (int64_t i = 0; i < n; ++i) o[i] = store<O>(compute_t<O>(A(alpha) * A(load(px[i]))));
    });
  });
}

void cpu::cast(Tensor& out, const Tensor& x) {
  checks::check_same_numel(out, x, "cast out", "cast x", check_cpu);
  dispatch_floating(out.dtype(), "cast", [&]<class O>(std::type_identity<O>) {
    dispatch_floating(x.dtype(), "cast", [&]<class I>(std::type_identity<I>) {
      O* o = out.data<O>();
      const I* px = x.data<I>();
      const int64_t n = out.numel();
#pragma omp parallel for if (worth_parallel(n))
      for (int64_t i = 0; i < n; ++i) o[i] = store<O>(compute_t<O>(load(px[i])));
    });
  });
}

void cpu::transpose01(Tensor& out, const Tensor& in) {
  checks::check_transpose01(out, in, check_cpu);
  const auto* src = static_cast<const char*>(in.raw());
  auto* dst = static_cast<char*>(out.raw());
  // out[j, i, :] = in[i, j, :]; the trailing block is copied as bytes, so any dtype works.
  const int64_t d0 = in.dim(0), d1 = in.dim(1);
  const size_t block = d0 * d1 == 0 ? 0 : size_t(in.numel() / (d0 * d1)) * in.element_size();
#pragma omp parallel for if (worth_parallel(in.numel()))
  for (int64_t j = 0; j < d1; ++j)
    for (int64_t i = 0; i < d0; ++i)
      std::memcpy(dst + size_t(j * d0 + i) * block, src + size_t(i * d1 + j) * block, block);
}

}  // namespace megatron::ops
