// GELU (tanh approximation) and SwiGLU on the CPU, elementwise in float (double for f64).
#include "megatron/ops/activation.h"

#include <cmath>

#include "megatron/ops/checks/activation.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/cpu/gelu.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

template <class T>
void gelu_forward_kernel(T* y, const T* x, int64_t n) {
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(gelu(load(x[i])));
}

template <class T>
void gelu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dx[i] = store<T>(gelu_grad(load(x[i])) * load(dy[i]));
}

template <class A>
A sigmoid(A v) {
  return A(1) / (A(1) + std::exp(-v));
}

// x (N, 2F) rows [gate | up] -> y (N, F) = silu(gate) * up.
template <class T>
void swiglu_forward_kernel(T* y, const T* x, int64_t N, int64_t F) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * F))
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = x + n * 2 * F;
    const T* up = gate + F;
    for (int64_t f = 0; f < F; ++f) {
      const A g = load(gate[f]);
      y[n * F + f] = store<T>(g * sigmoid(g) * load(up[f]));
    }
  }
}

template <class T>
void swiglu_backward_kernel(T* dx, const T* dy, const T* x, int64_t N, int64_t F) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * F))
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = x + n * 2 * F;
    const T* up = gate + F;
    T* dgate = dx + n * 2 * F;
    T* dup = dgate + F;
    for (int64_t f = 0; f < F; ++f) {
      // silu'(g) = sig(g) (1 + g (1 - sig(g)));  dgate = dy up silu'(g);  dup = dy silu(g)
      const A g = load(gate[f]), u = load(up[f]), d = load(dy[n * F + f]);
      const A sg = sigmoid(g);
      dgate[f] = store<T>(d * u * sg * (A(1) + g * (A(1) - sg)));
      dup[f] = store<T>(d * g * sg);
    }
  }
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::gelu_forward(Tensor& y, const Tensor& x) {
  checks::check_gelu_forward(y, x, check_cpu);
  dispatch_floating(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) {
    gelu_forward_kernel<T>(y.data<T>(), x.data<T>(), x.numel());
  });
}

void cpu::gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  checks::check_gelu_backward(dx, dy, x, check_cpu);
  dispatch_floating(x.dtype(), "gelu_backward", [&]<class T>(std::type_identity<T>) {
    gelu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
  });
}

void cpu::swiglu_forward(Tensor& y, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_forward(y, x, check_cpu);
  const int64_t N = dims.rows, F = dims.features;
  dispatch_floating(x.dtype(), "swiglu_forward",
                    [&]<class T>(std::type_identity<T>) { swiglu_forward_kernel<T>(y.data<T>(), x.data<T>(), N, F); });
}

void cpu::swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_backward(dx, dy, x, check_cpu);
  const int64_t N = dims.rows, F = dims.features;
  dispatch_floating(x.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    swiglu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), N, F);
  });
}

// The reference composes the unfused ops: the contract's definition.
void cpu::swiglu_forward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  const checks::SwigluDims dims = checks::check_swiglu_forward_fp8(q, q_t, amax, x, scale, check_cpu);
  Tensor y = Tensor::empty({dims.rows, dims.features}, x.dtype());
  cpu::swiglu_forward(y, x);
  cpu::fp8_quantize_transpose(q, q_t, amax, y, scale);
}

void cpu::swiglu_backward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dy, const Tensor& x,
                              const Tensor& scale) {
  const checks::SwigluDims dims = checks::check_swiglu_backward_fp8(q, q_t, amax, dy, x, scale, check_cpu);
  Tensor dx = Tensor::empty({dims.rows, 2 * dims.features}, x.dtype());
  cpu::swiglu_backward(dx, dy, x);
  cpu::fp8_quantize_transpose(q, q_t, amax, dx, scale);
}

}  // namespace megatron::ops
