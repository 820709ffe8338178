// GELU (tanh approximation) and SwiGLU on the CPU, elementwise in float (double for f64).
#include "megatron/ops/activation.h"

#include <cmath>

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

void check_like(const Tensor& t, const Tensor& x, const Shape& shape, const char* name) {
  check_cpu(t, name);
  check_shape(t, shape, name);
  check_dtype(t, x.dtype(), name);
}

// SwiGLU shapes: x (..., 2F) and y (..., F).
int64_t swiglu_features(const Tensor& x) {
  check_defined(x, "swiglu x");
  MEGATRON_CHECK(x.ndim() >= 1 && x.dim(-1) % 2 == 0,
                 "swiglu x must end in 2F = [gate | up] channels, got shape " << shape_str(x.shape()));
  return x.dim(-1) / 2;
}

Shape half_last(const Shape& shape) {
  Shape s = shape;
  s.back() /= 2;
  return s;
}

}  // namespace

void gelu_forward(Tensor& y, const Tensor& x) {
  check_defined(x, "gelu x");
  check_cpu(x, "gelu x");
  check_like(y, x, x.shape(), "gelu y");
  dispatch_floating(x.dtype(), "gelu_forward", [&]<class T>(std::type_identity<T>) {
    gelu_forward_kernel<T>(y.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  check_defined(x, "gelu x");
  check_cpu(x, "gelu x");
  check_like(dy, x, x.shape(), "gelu dy");
  check_like(dx, x, x.shape(), "gelu dx");
  dispatch_floating(x.dtype(), "gelu_backward", [&]<class T>(std::type_identity<T>) {
    gelu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor& y, const Tensor& x) {
  const int64_t F = swiglu_features(x), N = rows_of(x, "swiglu x");
  check_cpu(x, "swiglu x");
  check_like(y, x, half_last(x.shape()), "swiglu y");
  dispatch_floating(x.dtype(), "swiglu_forward",
                    [&]<class T>(std::type_identity<T>) { swiglu_forward_kernel<T>(y.data<T>(), x.data<T>(), N, F); });
}

void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t F = swiglu_features(x), N = rows_of(x, "swiglu x");
  check_cpu(x, "swiglu x");
  check_like(dy, x, half_last(x.shape()), "swiglu dy");
  check_like(dx, x, x.shape(), "swiglu dx");
  dispatch_floating(x.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    swiglu_backward_kernel<T>(dx.data<T>(), dy.data<T>(), x.data<T>(), N, F);
  });
}

}  // namespace megatron::ops::cpu
