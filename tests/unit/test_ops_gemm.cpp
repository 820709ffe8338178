#include <gtest/gtest.h>

#include <cmath>

#include "megatron/ops/activation.h"
#include "megatron/ops/gemm.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::MatmulParams;
using megatron::ops::Transpose;

namespace {

// C = alpha op(A) op(B) + beta C0 by plain loops in double.
Tensor naive_matmul(const Tensor& a, const Tensor& b, const Tensor& c0, bool ta, bool tb, double alpha, double beta) {
  const int64_t m = c0.dim(0), n = c0.dim(1), k = ta ? a.dim(0) : a.dim(1);
  Tensor c = Tensor::zeros({m, n}, DType::f64);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a.item(p * m + i) : a.item(i * k + p);
        const double bv = tb ? b.item(j * k + p) : b.item(p * n + j);
        s += av * bv;
      }
      c.set_item(i * n + j, alpha * s + beta * c0.item(i * n + j));
    }
  }
  return c;
}

struct LinearGrads {
  Tensor dx, dw, db;
};

LinearGrads run_linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w) {
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  LinearGrads g{poisoned(x.shape(), x.dtype()), Tensor::zeros(w.shape(), acc), Tensor::zeros({w.dim(0)}, acc)};
  ops::linear_backward(g.dx, g.dw, g.db, dy, x, w, ops::GradWrite::accumulate);
  return g;
}

constexpr int64_t kS = 5, kB = 2, kIn = 8, kOut = 6;

}  // namespace

TEST(Matmul, AllTransposeCombinationsMatchNaiveLoops) {
  const int64_t m = 5, n = 7, k = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, DType::f64, 1);
      const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, DType::f64, 2);
      const Tensor c0 = randn({m, n}, DType::f64, 3);
      const Tensor expected = naive_matmul(a, b, c0, ta, tb, 0.5, 2.0);
      const MatmulParams p{ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no, 0.5f, 2.0f};
      Tensor c = c0.clone();
      ops::matmul(c, a, b, p);
      // dgemm vs loops in double: both O(k) roundings of O(1) terms, k = 3.
      EXPECT_TRUE(matches_reference(c, expected, 0x1p-53, 16.0)) << "f64 ta=" << ta << " tb=" << tb;

      // The same product in f32 and with bf16/f16 operands into an f32 C (inputs are bf16-exact).
      // Each element is a k-term dot product plus the beta term: at most (k + 2) roundings in f32.
      for (DType in : {DType::f32, DType::bf16, DType::f16}) {
        Tensor c32 = c0.to(DType::f32);
        ops::matmul(c32, a.to(in), b.to(in), p);
        EXPECT_TRUE(matches_reference(c32, expected, kUnitRoundoffF32, double(k + 2)))
            << dtype_name(in) << " ta=" << ta << " tb=" << tb;
      }
    }
  }
}

TEST(Matmul, HalfOutputRoundsOnceAndBetaZeroIgnoresOldC) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor a = randn({4, 8}, dt, 4), b = randn({8, 3}, dt, 5);
    Tensor c = poisoned({4, 3}, dt);  // beta = 0: C is written, never read
    ops::matmul(c, a, b, {});
    ASSERT_TRUE(all_finite(c)) << dtype_name(dt);
    const Tensor expected =
        naive_matmul(a.to(DType::f64), b.to(DType::f64), Tensor::zeros({4, 3}, DType::f64), false, false, 1.0, 0.0);
    // f32 accumulation (8 terms, ~2^-21 relative) then one rounding to the 16-bit C (<= u |c|): factor 2.
    EXPECT_TRUE(matches_reference(c, expected, unit_roundoff(dt), 2.0)) << dtype_name(dt);
  }
}

TEST(Matmul, RejectsMismatchedShapesAndDtypes) {
  Tensor c = Tensor::zeros({4, 3}, DType::f32);
  EXPECT_THROW(ops::matmul(c, randn({4, 8}, DType::f32, 1), randn({7, 3}, DType::f32, 2), {}), Error);
  EXPECT_THROW(ops::matmul(c, randn({4, 8}, DType::f32, 1), randn({8, 4}, DType::f32, 2), {}), Error);
  EXPECT_THROW(ops::matmul(c, randn({4, 8}, DType::f32, 1), randn({8, 3}, DType::bf16, 2), {}), Error);
  Tensor c16 = Tensor::zeros({4, 3}, DType::bf16);
  EXPECT_THROW(ops::matmul(c16, randn({4, 8}, DType::f32, 1), randn({8, 3}, DType::f32, 2), {}), Error);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    Tensor x = randn({kS, kB, kIn}, DType::f64, 10);  // leading dims (S,B) are flattened to rows
    Tensor w = randn({kOut, kIn}, DType::f64, 11);
    Tensor b = with_bias ? randn({kOut}, DType::f64, 12) : Tensor();
    const Tensor r = randn({kS, kB, kOut}, DType::f64, 13);
    const auto loss = [&] {
      Tensor y = Tensor::empty({kS, kB, kOut}, DType::f64);
      ops::linear_forward(y, x, w, b);
      return sum_product(y, r);
    };
    Tensor dx = poisoned(x.shape(), DType::f64), dw = Tensor::zeros(w.shape(), DType::f64);
    Tensor db = with_bias ? Tensor::zeros({kOut}, DType::f64) : Tensor();
    ops::linear_backward(dx, dw, db, r, x, w, ops::GradWrite::accumulate);  // dL/dy = R
    EXPECT_TRUE(grad_close(dx, numeric_grad(x, loss))) << "dx, bias " << with_bias;
    EXPECT_TRUE(grad_close(dw, numeric_grad(w, loss))) << "dw, bias " << with_bias;
    if (with_bias) {
      EXPECT_TRUE(grad_close(db, numeric_grad(b, loss))) << "db";
    }
  }
}

TEST(Linear, LowerPrecisionMatchesF64) {
  const Tensor x = randn({kS, kB, kIn}, DType::f64, 20), w = randn({kOut, kIn}, DType::f64, 21);
  const Tensor b = randn({kOut}, DType::f64, 22), dy = randn({kS, kB, kOut}, DType::f64, 23);
  Tensor y64 = Tensor::empty({kS, kB, kOut}, DType::f64);
  ops::linear_forward(y64, x, w, b);
  const LinearGrads g64 = run_linear_backward(dy, x, w);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor y = poisoned({kS, kB, kOut}, dt);
    ops::linear_forward(y, x.to(dt), w.to(dt), b.to(dt));
    const LinearGrads g = run_linear_backward(dy.to(dt), x.to(dt), w.to(dt));
    const double u = unit_roundoff(dt);
    // Activations (y, dx): dot products of K <= 8 terms accumulate in f32, error <= K u32 of the
    // operand magnitudes; bf16/f16 add one rounding of the result (<= u). Factors: 8 for f32, 2 for 16-bit.
    const double factor = dt == DType::f32 ? 8.0 : 2.0;
    EXPECT_TRUE(matches_reference(y, y64, u, factor)) << dtype_name(dt) << " y";
    EXPECT_TRUE(matches_reference(g.dx, g64.dx, u, factor)) << dtype_name(dt) << " dx";
    // Parameter gradients are f32 for every dtype: sums of N = 10 products, no 16-bit rounding at all.
    EXPECT_TRUE(matches_reference(g.dw, g64.dw, kUnitRoundoffF32, 10.0)) << dtype_name(dt) << " dw";
    EXPECT_TRUE(matches_reference(g.db, g64.db, kUnitRoundoffF32, 10.0)) << dtype_name(dt) << " db";
  }
}

TEST(Linear, ParameterGradientsAccumulateActivationGradientsOverwrite) {
  const Tensor x = randn({kS * kB, kIn}, DType::f32, 30), w = randn({kOut, kIn}, DType::f32, 31);
  const Tensor dy = randn({kS * kB, kOut}, DType::f32, 32);
  const LinearGrads once = run_linear_backward(dy, x, w);
  ASSERT_TRUE(all_finite(once.dx));  // started as NaN: fully overwritten

  Tensor dx = filled(x.shape(), DType::f32, 123.0);
  Tensor dw = Tensor::zeros(w.shape(), DType::f32), db = Tensor::zeros({kOut}, DType::f32);
  ops::linear_backward(dx, dw, db, dy, x, w, ops::GradWrite::accumulate);
  ops::linear_backward(dx, dw, db, dy, x, w, ops::GradWrite::accumulate);
  // Same arithmetic twice: the second call adds exactly the first result again (G + G = 2G exactly).
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(dw.item(i), 2.0 * once.dw.item(i)) << "dw " << i;
  for (int64_t i = 0; i < db.numel(); ++i) ASSERT_EQ(db.item(i), 2.0 * once.db.item(i)) << "db " << i;
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(dx.item(i), once.dx.item(i)) << "dx " << i;
}

// GradWrite::overwrite: dW is written over whatever the main grad held (NaN here, never read),
// equal to accumulating into zeros; db still accumulates. Also the GELU-fused form.
TEST(Linear, OverwrittenWeightGradientIgnoresTheOldValues) {
  const Tensor x = randn({kS * kB, kIn}, DType::f32, 36), w = randn({kOut, kIn}, DType::f32, 37);
  const Tensor dy = randn({kS * kB, kOut}, DType::f32, 38);
  const LinearGrads once = run_linear_backward(dy, x, w);
  Tensor dx = Tensor::empty(x.shape(), DType::f32), dw = filled(w.shape(), DType::f32, std::nan(""));
  Tensor db = filled({kOut}, DType::f32, 1.0);
  ops::linear_backward(dx, dw, db, dy, x, w, ops::GradWrite::overwrite);
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(dw.item(i), once.dw.item(i)) << "dw " << i;
  for (int64_t i = 0; i < db.numel(); ++i) ASSERT_EQ(db.item(i), float(1.0 + once.db.item(i))) << "db " << i;

  const Tensor pre = randn({kS * kB, kIn}, DType::f32, 39);
  Tensor gelu_x = Tensor::empty(pre.shape(), DType::f32);
  ops::gelu_forward(gelu_x, pre);
  Tensor dpre = Tensor::empty(pre.shape(), DType::f32), no_db;
  Tensor dw_zeroed = Tensor::zeros(w.shape(), DType::f32), dw_nan = filled(w.shape(), DType::f32, std::nan(""));
  ops::gelu_linear_backward(dpre, dw_zeroed, no_db, dy, gelu_x, w, pre, ops::GradWrite::accumulate);
  ops::gelu_linear_backward(dpre, dw_nan, no_db, dy, gelu_x, w, pre, ops::GradWrite::overwrite);
  EXPECT_EQ(dw_nan.to_vector(), dw_zeroed.to_vector());
}

// A TP layer splits its backward: dX first (its collective starts), then dW and db. The two halves
// run the same GEMMs as one call, so they must match it exactly.
TEST(Linear, DgradAndWgradInSeparateCallsEqualOneCall) {
  const Tensor x = randn({kS * kB, kIn}, DType::f32, 33), w = randn({kOut, kIn}, DType::f32, 34);
  const Tensor dy = randn({kS * kB, kOut}, DType::f32, 35);
  const LinearGrads once = run_linear_backward(dy, x, w);
  Tensor dx = filled(x.shape(), DType::f32, 123.0);
  Tensor dw = Tensor::zeros(w.shape(), DType::f32), db = Tensor::zeros({kOut}, DType::f32);
  Tensor none;
  ops::linear_backward(dx, none, none, dy, x, w, ops::GradWrite::accumulate);
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(dw.item(i), 0.0) << "dw untouched " << i;
  ops::linear_backward(none, dw, db, dy, x, w, ops::GradWrite::accumulate);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(dx.item(i), once.dx.item(i)) << "dx " << i;
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(dw.item(i), once.dw.item(i)) << "dw " << i;
  for (int64_t i = 0; i < db.numel(); ++i) ASSERT_EQ(db.item(i), once.db.item(i)) << "db " << i;
  EXPECT_TRUE(throws_error_naming([&] { ops::linear_backward(dx, none, db, dy, x, w, ops::GradWrite::accumulate); },
                                  "linear dbias"));
}

TEST(Linear, HalfWeightGradientAccumulatesIntoF32MainGrad) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = randn({kS * kB, kIn}, dt, 40), w = randn({kOut, kIn}, dt, 41);
    const Tensor dy = randn({kS * kB, kOut}, dt, 42);
    const Tensor main_grad0 = randn({kOut, kIn}, DType::f32, 43, 1000.0);
    Tensor main_grad = main_grad0.clone();
    Tensor no_dx, no_db;  // undefined: skipped
    ops::linear_backward(no_dx, main_grad, no_db, dy, x, w, ops::GradWrite::accumulate);
    const Tensor fresh = run_linear_backward(dy, x, w).dw;
    // main_grad = old + dy^T x: one f32 addition on top of the fresh gradient (terms ~1000).
    Tensor expected = Tensor::empty(main_grad.shape(), DType::f64);
    for (int64_t i = 0; i < expected.numel(); ++i) expected.set_item(i, main_grad0.item(i) + fresh.item(i));
    EXPECT_TRUE(matches_reference(main_grad, expected, kUnitRoundoffF32, 4.0)) << dtype_name(dt);
  }
}

TEST(Linear, RejectsBadShapesAndDtypes) {
  const Tensor x = randn({4, kIn}, DType::f32, 1), w = randn({kOut, kIn}, DType::f32, 2);
  Tensor y = Tensor::empty({4, kOut}, DType::f32);
  Tensor bad_y = Tensor::empty({4, kOut + 1}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::linear_forward(bad_y, x, w, Tensor()); }, "linear y"));
  EXPECT_THROW(ops::linear_forward(y, randn({4, kIn + 1}, DType::f32, 3), w, Tensor()), Error);
  EXPECT_THROW(ops::linear_forward(y, x, w, randn({kOut + 1}, DType::f32, 4)), Error);
  Tensor dx = Tensor::empty(x.shape(), DType::f32), db;
  Tensor dw_bf16 = Tensor::zeros(w.shape(), DType::bf16);  // main grads are f32
  EXPECT_TRUE(throws_error_naming(
      [&] {
        ops::linear_backward(dx, dw_bf16, db, randn({4, kOut}, DType::f32, 5), x, w, ops::GradWrite::accumulate);
      },
      "linear dweight"));
}

// ---- the GELU fused into the MLP's GEMMs -----------------------------------------------------

TEST(LinearGelu, ForwardIsLinearThenGeluBitwiseInF32AndF64) {
  // With a 32- or 64-bit pre-activation, the accumulator is pre exactly, so gelu of the
  // accumulator is gelu_forward(pre).
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool with_bias : {true, false}) {
      const Tensor x = randn({kS, kB, kIn}, dt, 70), w = randn({kOut, kIn}, dt, 71);
      const Tensor b = with_bias ? randn({kOut}, dt, 72) : Tensor();
      Tensor y = poisoned({kS, kB, kOut}, dt), pre = poisoned({kS, kB, kOut}, dt);
      ops::linear_gelu_forward(y, pre, x, w, b);
      Tensor pre_ref = poisoned({kS, kB, kOut}, dt), y_ref = poisoned({kS, kB, kOut}, dt);
      ops::linear_forward(pre_ref, x, w, b);
      ops::gelu_forward(y_ref, pre_ref);
      EXPECT_TRUE(all_close(pre, pre_ref, 0.0, 0.0)) << dtype_name(dt) << " pre, bias " << with_bias;
      EXPECT_TRUE(all_close(y, y_ref, 0.0, 0.0)) << dtype_name(dt) << " y, bias " << with_bias;
    }
  }
}

TEST(LinearGelu, HalfPrecisionMatchesF64) {
  const Tensor x = randn({kS, kB, kIn}, DType::f64, 80), w = randn({kOut, kIn}, DType::f64, 81);
  const Tensor b = randn({kOut}, DType::f64, 82);
  Tensor y64 = Tensor::empty({kS, kB, kOut}, DType::f64), pre64 = Tensor::empty({kS, kB, kOut}, DType::f64);
  ops::linear_gelu_forward(y64, pre64, x, w, b);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor y = poisoned({kS, kB, kOut}, dt), pre = poisoned({kS, kB, kOut}, dt);
    ops::linear_gelu_forward(y, pre, x.to(dt), w.to(dt), b.to(dt));
    // f32 accumulation of K = 8 terms (~2^-21 relative, times GELU's slope <= 1.13 for y), then one
    // rounding to the 16-bit output (<= u): factor 2, as Linear.LowerPrecisionMatchesF64.
    EXPECT_TRUE(matches_reference(pre, pre64, unit_roundoff(dt), 2.0)) << dtype_name(dt) << " pre";
    EXPECT_TRUE(matches_reference(y, y64, unit_roundoff(dt), 2.0)) << dtype_name(dt) << " y";
  }
}

TEST(GeluLinear, GradientsMatchFiniteDifferences) {
  // L = sum(R (gelu(pre) W^T + b)): the backward of fc2 with the GELU before it.
  for (bool with_bias : {true, false}) {
    Tensor pre = randn({kS, kB, kIn}, DType::f64, 90, 2.0), w = randn({kOut, kIn}, DType::f64, 91);
    Tensor b = with_bias ? randn({kOut}, DType::f64, 92) : Tensor();
    const Tensor r = randn({kS, kB, kOut}, DType::f64, 93);
    const auto gelu_of_pre = [&] {
      Tensor x = Tensor::empty(pre.shape(), DType::f64);
      ops::gelu_forward(x, pre);
      return x;
    };
    const auto loss = [&] {
      Tensor y = Tensor::empty({kS, kB, kOut}, DType::f64);
      ops::linear_forward(y, gelu_of_pre(), w, b);
      return sum_product(y, r);
    };
    Tensor dpre = poisoned(pre.shape(), DType::f64), dw = Tensor::zeros(w.shape(), DType::f64);
    Tensor db = with_bias ? Tensor::zeros({kOut}, DType::f64) : Tensor();
    ops::gelu_linear_backward(dpre, dw, db, r, gelu_of_pre(), w, pre, ops::GradWrite::accumulate);
    EXPECT_TRUE(grad_close(dpre, numeric_grad(pre, loss))) << "dpre, bias " << with_bias;
    EXPECT_TRUE(grad_close(dw, numeric_grad(w, loss))) << "dw, bias " << with_bias;
    if (with_bias) {
      EXPECT_TRUE(grad_close(db, numeric_grad(b, loss))) << "db";
    }
  }
}

TEST(GeluLinear, LowerPrecisionMatchesF64) {
  const Tensor pre64 = randn({kS, kB, kIn}, DType::f64, 100, 2.0), w = randn({kOut, kIn}, DType::f64, 101);
  const Tensor dy = randn({kS, kB, kOut}, DType::f64, 102);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor pre = pre64.to(dt);
    Tensor x = Tensor::empty(pre.shape(), dt);
    ops::gelu_forward(x, pre);
    // The reference takes the same (rounded) x, so dw and db compare the arithmetic alone.
    Tensor dpre64 = poisoned(pre.shape(), DType::f64), dw64 = Tensor::zeros(w.shape(), DType::f64);
    Tensor db64 = Tensor::zeros({kOut}, DType::f64);
    ops::gelu_linear_backward(dpre64, dw64, db64, dy, x.to(DType::f64), w, pre64, ops::GradWrite::accumulate);
    Tensor dpre = poisoned(pre.shape(), dt), dw = Tensor::zeros(w.shape(), DType::f32);
    Tensor db = Tensor::zeros({kOut}, DType::f32);
    ops::gelu_linear_backward(dpre, dw, db, dy.to(dt), x, w.to(dt), pre, ops::GradWrite::accumulate);
    // dpre: a K = 6 term dot product in f32, times gelu'(pre) (<= 1.13, itself a few f32 roundings
    // from tanh and the polynomial), then for 16-bit one rounding: factor 16 for f32, 2 for 16-bit.
    const double factor = dt == DType::f32 ? 16.0 : 2.0;
    EXPECT_TRUE(matches_reference(dpre, dpre64, unit_roundoff(dt), factor)) << dtype_name(dt) << " dpre";
    // Parameter gradients are f32 sums of N = 10 products, as Linear.LowerPrecisionMatchesF64.
    EXPECT_TRUE(matches_reference(dw, dw64, kUnitRoundoffF32, 10.0)) << dtype_name(dt) << " dw";
    EXPECT_TRUE(matches_reference(db, db64, kUnitRoundoffF32, 10.0)) << dtype_name(dt) << " db";
  }
}

TEST(LinearGelu, RejectsBadPreActivations) {
  const Tensor x = randn({4, kIn}, DType::f32, 1), w = randn({kOut, kIn}, DType::f32, 2);
  Tensor y = Tensor::empty({4, kOut}, DType::f32), bad_pre = Tensor::empty({4, kOut + 1}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::linear_gelu_forward(y, bad_pre, x, w, Tensor()); }, "linear pre"));
  Tensor pre_bf16 = Tensor::empty({4, kIn}, DType::bf16), dpre = Tensor::empty({4, kIn}, DType::f32);
  Tensor dw = Tensor::zeros(w.shape(), DType::f32), no_db;
  const Tensor dy = randn({4, kOut}, DType::f32, 3);
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::gelu_linear_backward(dpre, dw, no_db, dy, x, w, pre_bf16, ops::GradWrite::accumulate); },
      "linear pre"));
  Tensor no_dpre;
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::gelu_linear_backward(no_dpre, dw, no_db, dy, x, w, x, ops::GradWrite::accumulate); }, "linear dpre"));
}
