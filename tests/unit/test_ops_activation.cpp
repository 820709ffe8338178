#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/ops/activation.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

constexpr int64_t kS = 5, kB = 2, kC = 8, kF = 8;

}  // namespace

TEST(Gelu, KnownValues) {
  const Tensor x = Tensor::from_vector({0, 1, -1, 10, -10}, {5}, DType::f64);
  Tensor y = Tensor::empty({5}, DType::f64);
  ops::gelu_forward(y, x);
  // tanh-GELU(1) = 0.8411920 (PyTorch gelu(approximate='tanh')); the form gives gelu(x) - gelu(-x) = x;
  // far from 0 it is x or 0.
  EXPECT_EQ(y.item(0), 0.0);
  EXPECT_NEAR(y.item(1), 0.8411920, 1e-7);
  EXPECT_NEAR(y.item(2), 0.8411920 - 1.0, 1e-7);
  EXPECT_NEAR(y.item(3), 10.0, 1e-12);
  EXPECT_NEAR(y.item(4), 0.0, 1e-12);
}

TEST(Swiglu, KnownValues) {
  // One row [gate | up] = [1, -2 | 3, 0.5]: y = silu(gate) * up, silu(g) = g sigmoid(g); sigmoid(1) = 0.7310585786.
  const Tensor x = Tensor::from_vector({1, -2, 3, 0.5}, {1, 4}, DType::f64);
  Tensor y = Tensor::empty({1, 2}, DType::f64);
  ops::swiglu_forward(y, x);
  EXPECT_NEAR(y.item(0), 0.7310585786300049 * 3.0, 1e-14);
  EXPECT_NEAR(y.item(1), -2.0 / (1.0 + std::exp(2.0)) * 0.5, 1e-14);
}

TEST(Activation, GradientsMatchFiniteDifferences) {
  {
    Tensor x = randn({kS, kB, kC}, DType::f64, 1, 2.0);
    const Tensor r = randn({kS, kB, kC}, DType::f64, 2);
    const auto loss = [&] {
      Tensor y = Tensor::empty(x.shape(), DType::f64);
      ops::gelu_forward(y, x);
      return sum_product(y, r);
    };
    Tensor dx = poisoned(x.shape(), DType::f64);
    ops::gelu_backward(dx, r, x);
    EXPECT_TRUE(grad_close(dx, numeric_grad(x, loss))) << "gelu";
  }
  {
    Tensor x = randn({kS, kB, 2 * kF}, DType::f64, 3, 2.0);
    const Tensor r = randn({kS, kB, kF}, DType::f64, 4);
    const auto loss = [&] {
      Tensor y = Tensor::empty({kS, kB, kF}, DType::f64);
      ops::swiglu_forward(y, x);
      return sum_product(y, r);
    };
    Tensor dx = poisoned(x.shape(), DType::f64);
    ops::swiglu_backward(dx, r, x);
    EXPECT_TRUE(grad_close(dx, numeric_grad(x, loss))) << "swiglu";
  }
}

TEST(Activation, LowerPrecisionMatchesF64) {
  const Tensor x = randn({kS, kB, 2 * kF}, DType::f64, 10, 2.0);
  const Tensor dy_gelu = randn({kS, kB, 2 * kF}, DType::f64, 11), dy_swiglu = randn({kS, kB, kF}, DType::f64, 12);
  const auto run = [&](DType dt) {
    std::vector<Tensor> outs{poisoned(x.shape(), dt), poisoned(x.shape(), dt), poisoned({kS, kB, kF}, dt),
                             poisoned(x.shape(), dt)};
    ops::gelu_forward(outs[0], x.to(dt));
    ops::gelu_backward(outs[1], dy_gelu.to(dt), x.to(dt));
    ops::swiglu_forward(outs[2], x.to(dt));
    ops::swiglu_backward(outs[3], dy_swiglu.to(dt), x.to(dt));
    return outs;
  };
  const std::vector<Tensor> ref = run(DType::f64);
  const char* names[] = {"gelu y", "gelu dx", "swiglu y", "swiglu dx"};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<Tensor> got = run(dt);
    // About ten float operations per element, tanh/exp accurate to a few ulp: factor 16 in f32.
    // bf16/f16: one rounding of the result dominates (the f32 part is 2^-16 / 2^-13 smaller): factor 2.
    const double factor = dt == DType::f32 ? 16.0 : 2.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(matches_reference(got[i], ref[i], unit_roundoff(dt), factor)) << dtype_name(dt) << " " << names[i];
    }
  }
}

TEST(Activation, BackwardOverwritesDx) {
  const Tensor x = randn({kS, 2 * kF}, DType::f32, 20), dy = randn({kS, kF}, DType::f32, 21);
  Tensor dx = poisoned(x.shape(), DType::f32);
  ops::swiglu_backward(dx, dy, x);
  EXPECT_TRUE(all_finite(dx));
  Tensor again = filled(x.shape(), DType::f32, 5.0);
  ops::swiglu_backward(again, dy, x);
  EXPECT_TRUE(all_close(again, dx, 0.0, 0.0));
  Tensor gx = poisoned(x.shape(), DType::f32);
  ops::gelu_backward(gx, x, x);
  EXPECT_TRUE(all_finite(gx));
}

TEST(Activation, RejectsBadArguments) {
  const Tensor odd = randn({4, 7}, DType::f32, 1);
  Tensor y = Tensor::empty({4, 3}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::swiglu_forward(y, odd); }, "swiglu x"));
  const Tensor x = randn({4, 8}, DType::f32, 2);
  Tensor wrong = Tensor::empty({4, 8}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::swiglu_forward(wrong, x); }, "swiglu y"));
  Tensor half = Tensor::empty({4, 8}, DType::f16);
  EXPECT_TRUE(throws_error_naming([&] { ops::gelu_forward(half, x); }, "gelu y"));
  Tensor ints = Tensor::zeros({4, 8}, DType::i32);
  EXPECT_TRUE(throws_error_naming([&] { ops::gelu_forward(ints, ints); }, "not supported"));
}
