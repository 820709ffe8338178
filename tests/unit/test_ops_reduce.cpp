#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/reduce.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

TEST(Reduce, KnownSumsAccumulate) {
  const Tensor a = Tensor::from_vector({1, 2, 3}, {3}), b = Tensor::from_vector({4, 5, 6}, {3});
  Tensor acc = filled({1}, DType::f32, 1.0);
  ops::sum_squares(acc, a);  // 1 + 14
  EXPECT_EQ(acc.item(0), 15.0);
  ops::dot(acc, a, b);  // + 32
  EXPECT_EQ(acc.item(0), 47.0);
  Tensor acc64 = Tensor::zeros({1}, DType::f64);
  ops::sum_squares(acc64, a.to(DType::f64));
  EXPECT_EQ(acc64.item(0), 14.0);
}

TEST(Reduce, CountsNonFiniteInEveryFloatingDtype) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Tensor x = randn({100}, dt, 1);
    x.set_item(3, nan);
    x.set_item(50, inf);
    x.set_item(99, -inf);
    Tensor acc = Tensor::zeros({1}, dt == DType::f64 ? DType::f64 : DType::f32);
    ops::count_nonfinite(acc, x);
    ops::count_nonfinite(acc, x);
    EXPECT_EQ(acc.item(0), 6.0) << dtype_name(dt);
  }
}

// --log-num-zeros-in-grad: +0 and -0 count, a denormal or a NaN does not; into an f64 accumulator
// whatever the dtype, where a count past 2^24 stays exact (an f32 one would round it).
TEST(Reduce, CountsZerosExactly) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Tensor x = randn({100}, dt, 2);
    x.set_item(0, 0.0);
    x.set_item(7, -0.0);
    x.set_item(50, std::numeric_limits<double>::quiet_NaN());
    x.set_item(60, dt == DType::f64 ? 1e-310 : dt == DType::f32 ? 1e-40 : 1e-7);  // a denormal: not zero
    x.set_item(99, 0.0);
    Tensor acc = Tensor::zeros({1}, dt == DType::f64 ? DType::f64 : DType::f32);
    ops::count_zeros(acc, x);
    EXPECT_EQ(acc.item(0), 3.0) << dtype_name(dt);
    Tensor acc64 = Tensor::zeros({1}, DType::f64);
    ops::count_zeros(acc64, x);
    EXPECT_EQ(acc64.item(0), 3.0) << dtype_name(dt);
  }
  const int64_t many = (int64_t(1) << 24) + 3;  // not a float: 2^24 + 3 rounds to 2^24 + 4
  Tensor zeros = Tensor::zeros({many}, DType::bf16), acc64 = Tensor::zeros({1}, DType::f64);
  ops::count_zeros(acc64, zeros);
  EXPECT_EQ(acc64.item(0), double(many));
  Tensor acc16 = Tensor::zeros({1}, DType::f16);
  EXPECT_THROW(ops::count_zeros(acc16, zeros), Error);  // accumulators are f32 or f64
}

// fp16 loss scaling relies on this chain: a result beyond f16's range is stored as Inf, the Inf
// reaches the fp32 main grads through the weight-gradient GEMM, and count_nonfinite finds it.
TEST(Reduce, CountsTheInfOfAnOverflowingF16Store) {
  // f16's largest finite value is 65504; a float rounds to Inf from 65520 (the midpoint to 2^16) up.
  const Tensor x = Tensor::from_vector({1.0f, 65504.0f, 65519.99f, 65520.0f, -7e4f, 1e5f}, {6});
  Tensor h = poisoned({6}, DType::f16);
  ops::cast(h, x);
  EXPECT_EQ(h.item(2), 65504.0);
  Tensor acc = Tensor::zeros({1}, DType::f32);
  ops::count_nonfinite(acc, h);
  EXPECT_EQ(acc.item(0), 3.0);

  // A linear layer in f16: row 0 of y is 256 * 256 + 256 * 256 = 131072, beyond 65504; row 1 is 0.
  const int64_t in = 2, out = 3;
  const Tensor xs = Tensor::from_vector({256, 256, 1, -1}, {2, in}, DType::f16);
  const Tensor w = filled({out, in}, DType::f16, 256.0);
  Tensor y = poisoned({2, out}, DType::f16);
  ops::linear_forward(y, xs, w, Tensor());
  acc.zero();
  ops::count_nonfinite(acc, y);
  EXPECT_EQ(acc.item(0), double(out));
  EXPECT_EQ(y.item(out), 0.0);

  // Backward with that Inf in dy: every element of the main-grad row it touches becomes Inf or NaN
  // (Inf * x, x != 0), and so does the bias gradient; nothing else does.
  Tensor dy = Tensor::zeros({2, out}, DType::f16);
  dy.set_item(1, std::numeric_limits<double>::infinity());
  Tensor dx = poisoned({2, in}, DType::f16), dw = Tensor::zeros({out, in}, DType::f32);
  Tensor db = Tensor::zeros({out}, DType::f32);
  ops::linear_backward(dx, dw, db, dy, xs, w, ops::GradWrite::accumulate);
  acc.zero();
  ops::count_nonfinite(acc, dw);
  EXPECT_EQ(acc.item(0), double(in));
  acc.zero();
  ops::count_nonfinite(acc, db);
  EXPECT_EQ(acc.item(0), 1.0);
}

TEST(Reduce, LargeSumsAreDoubleAccurateAndIndependentOfThreadCount) {
  const int64_t n = 300001;  // several blocks, the last one partial
  const Tensor x = randn({n}, DType::f32, 2), y = randn({n}, DType::f32, 3);
  double exact_sq = 0.0, exact_dot = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    exact_sq += x.item(i) * x.item(i);
    exact_dot += x.item(i) * y.item(i);
  }
  Tensor results[2][2];
  for (int t : {0, 1}) {
    with_threads(t == 0 ? 1 : 3, [&] {
      results[t][0] = Tensor::zeros({1}, DType::f32);
      results[t][1] = Tensor::zeros({1}, DType::f32);
      ops::sum_squares(results[t][0], x);
      ops::dot(results[t][1], x, y);
    });
  }
  EXPECT_EQ(results[0][0].item(0), results[1][0].item(0));
  EXPECT_EQ(results[0][1].item(0), results[1][1].item(0));
  // Summed in double (error ~n 2^-53 relative, far below f32) then rounded once to the f32
  // accumulator: within one f32 rounding of the loop sum in double (u |sum|, plus the dot's
  // cancellation scaled by sum |x y| <= sum of squares).
  EXPECT_NEAR(results[0][0].item(0), exact_sq, kUnitRoundoffF32 * exact_sq);
  EXPECT_NEAR(results[0][1].item(0), exact_dot, kUnitRoundoffF32 * std::fabs(exact_dot) + 1e-9 * exact_sq);
}

TEST(Reduce, RejectsBadAccumulators) {
  const Tensor x = randn({8}, DType::f64, 4);
  Tensor f32_acc = Tensor::zeros({1}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::sum_squares(f32_acc, x); }, "sum_squares acc"));  // f64 input: f64 acc
  Tensor two = Tensor::zeros({2}, DType::f64);
  EXPECT_TRUE(throws_error_naming([&] { ops::sum_squares(two, x); }, "sum_squares acc"));
  EXPECT_TRUE(throws_error_naming([&] { ops::dot(two, x, randn({7}, DType::f64, 5)); }, "dot b"));
}
