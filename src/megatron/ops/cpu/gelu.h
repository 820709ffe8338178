#pragma once
// GELU (tanh approximation, GPT-2's) and its derivative in A = float or double: one definition for
// the activation op (activation.cpp) and the GEMM with the GELU fused (gemm.cpp).
#include <cmath>

namespace megatron::ops::cpu {

template <class A>
constexpr A kSqrt2OverPi = A(0.79788456080286535587989211986876);
template <class A>
constexpr A kGeluCubic = A(0.044715);

// y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
template <class A>
A gelu(A x) {
  const A u = kSqrt2OverPi<A> * (x + kGeluCubic<A> * x * x * x);
  return A(0.5) * x * (A(1) + std::tanh(u));
}

// dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
template <class A>
A gelu_grad(A x) {
  const A u = kSqrt2OverPi<A> * (x + kGeluCubic<A> * x * x * x);
  const A t = std::tanh(u);
  const A du = kSqrt2OverPi<A> * (A(1) + A(3) * kGeluCubic<A> * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
}

}  // namespace megatron::ops::cpu
