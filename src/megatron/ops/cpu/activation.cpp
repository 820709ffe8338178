// GELU (tanh approximation) and SwiGLU on the CPU, elementwise in float (double for f64).
#include "megatron/ops/activation.h"

#include <cmath>

#include "megatron/ops/checks/activation.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

template <class A>
constexpr A kSqrt2OverPi = A(0.79788456080286535587989211986876);
template <class A>
constexpr A kGeluCubic = A(0.044715);

template <class T>
void gelu_forward_kernel(T* y, const T* x, int64_t n) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    // y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    const A v = load(x[i]);
    const A u = kSqrt2OverPi<A> * (v + kGeluCubic<A> * v * v * v);
    y[i] = store<T>(A(0.5) * v * (A(1) + std::tanh(u)));
  }
}

template <class T>
void gelu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    // dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    const A v = load(x[i]);
    const A u = kSqrt2OverPi<A> * (v + kGeluCubic<A> * v * v * v);
    const A t = std::tanh(u);
    const A du = kSqrt2OverPi<A> * (A(1) + A(3) * kGeluCubic<A> * v * v);
    const A grad = A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * du;
    dx[i] = store<T>(grad * load(dy[i]));
  }
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

void gelu_forward(Tensor& y, const Tensor& x) {
  checks::check_gelu_forward(y, x, check_cpu);
  dispatch_floating(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) {
    gelu_forward_kernel<T>(y.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  checks::check_gelu_backward(dx, dy, x, check_cpu);
  dispatch_floating(x.dtype(), "gelu_backward", [&]<class T>(std::type_identity<T>) {
    gelu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor& y, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_forward(y, x, check_cpu);
  const int64_t N = dims.rows, F = dims.features;
  dispatch_floating(x.dtype(), "swiglu_forward",
                    [&]<class T>(std::type_identity<T>) { swiglu_forward_kernel<T>(y.data<T>(), x.data<T>(), N, F); });
}

void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const checks::SwigluDims dims = checks::check_swiglu_backward(dx, dy, x, check_cpu);
  const int64_t N = dims.rows, F = dims.features;
  dispatch_floating(x.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    swiglu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), N, F);
  });
}

}  // namespace megatron::ops::cpu
