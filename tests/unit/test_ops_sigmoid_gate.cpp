// The sigmoid gate (ops/sigmoid_gate.h) on the CPU: a case worked by hand, and the backward of
// every input against central finite differences of the forward in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <tuple>

#include "megatron/core/rng.h"
#include "megatron/ops/sigmoid_gate.h"

using namespace megatron;

namespace {

// Uniform in [-1, 1).
Tensor random(const Shape& shape, uint64_t seed) {
  HostRng rng(seed);
  Tensor t = Tensor::empty(shape, DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = 2.0 * rng.uniform() - 1.0;
  return t;
}

Tensor f64(std::initializer_list<double> values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f64);
  std::copy(values.begin(), values.end(), t.data<double>());
  return t;
}

}  // namespace

// Two rows of H = 2: x . w = 0 gives the score 1/2 (half the row), x . w = ln 3 gives 3/4. With dy =
// out: g[t] = |out[t]|^2 s (1 - s), dout = s dy, dx = g w, dw = sum_t g[t] x[t].
TEST(OpsSigmoidGate, KnownAnswer) {
  const Tensor x = f64({1.0, -1.0, std::log(3.0), 0.0}, {2, 2});
  const Tensor w = f64({1.0, 1.0}, {2});
  const Tensor out = f64({2.0, 4.0, 8.0, -4.0}, {2, 2});
  Tensor y = Tensor::empty({2, 2}, DType::f64), score = Tensor::empty({2}, DType::f64);
  ops::sigmoid_gate_forward(y, score, out, x, w);
  EXPECT_DOUBLE_EQ(score.item(0), 0.5);
  EXPECT_NEAR(score.item(1), 0.75, 1e-15);
  const double expected_y[] = {1.0, 2.0, 6.0, -3.0};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y.item(i), expected_y[i], 1e-14) << i;

  Tensor dout = Tensor::empty({2, 2}, DType::f64), dx = Tensor::empty({2, 2}, DType::f64);
  Tensor dw = f64({10.0, 20.0}, {2});  // accumulates onto these
  ops::sigmoid_gate_backward(dout, dx, dw, out, out, x, w, score);
  const double g0 = 20.0 * 0.25, g1 = 80.0 * 0.1875;  // |out|^2 s (1 - s)
  const double expected_dout[] = {1.0, 2.0, 6.0, -3.0};
  const double expected_dx[] = {g0, g0, g1, g1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(dout.item(i), expected_dout[i], 1e-14) << i;
    EXPECT_NEAR(dx.item(i), expected_dx[i], 1e-13) << i;
  }
  EXPECT_NEAR(dw.item(0), 10.0 + g0 * 1.0 + g1 * std::log(3.0), 1e-12);
  EXPECT_NEAR(dw.item(1), 20.0 + g0 * -1.0, 1e-12);
}

// L = sum(y * r) for a fixed random r: dL/d(out, x, w) by the backward against central differences
// with step 1e-6; in f64 the truncation error (~1e-12 relative) and rounding (~1e-10) stay far
// below the bound of 1e-7 relative to the gradient's scale.
TEST(OpsSigmoidGate, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, H = 7;
  Tensor x = random({N, H}, 1), w = random({H}, 2), out = random({N, H}, 3);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] *= 0.3;  // scores away from 0 and 1
  const Tensor r = random({N, H}, 4);
  const auto loss = [&] {
    Tensor y = Tensor::empty({N, H}, DType::f64), score = Tensor::empty({N}, DType::f64);
    ops::sigmoid_gate_forward(y, score, out, x, w);
    double sum = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += y.item(i) * r.item(i);
    return sum;
  };
  Tensor y = Tensor::empty({N, H}, DType::f64), score = Tensor::empty({N}, DType::f64);
  ops::sigmoid_gate_forward(y, score, out, x, w);
  Tensor dout = Tensor::empty({N, H}, DType::f64), dx = Tensor::empty({N, H}, DType::f64);
  Tensor dw = Tensor::zeros({H}, DType::f64);
  ops::sigmoid_gate_backward(dout, dx, dw, r, out, x, w, score);
  const double step = 1e-6;
  for (auto [input, grad, name] : {std::tuple{&out, &dout, "out"}, {&x, &dx, "x"}, {&w, &dw, "w"}}) {
    for (int64_t i = 0; i < input->numel(); ++i) {
      double& v = input->data<double>()[i];
      const double kept = v;
      v = kept + step;
      const double up = loss();
      v = kept - step;
      const double down = loss();
      v = kept;
      EXPECT_NEAR(grad->item(i), (up - down) / (2 * step), 1e-7) << name << "[" << i << "]";
    }
  }
}
