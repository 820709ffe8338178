#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/ops/dropout.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::DropoutParams;

namespace {

const DropoutParams kP{0.3f, 42, stream_id("hidden_dropout")};

}  // namespace

TEST(Dropout, KeepsAboutOneMinusPAndPreservesTheMean) {
  const int64_t n = 100000;
  const Tensor x = filled({n}, DType::f32, 1.0);
  Tensor y = poisoned({n}, DType::f32);
  ops::dropout_forward(y, x, kP);
  int64_t kept = 0;
  double sum = 0.0;
  const float kept_value = 1.0f * (1.0f / (1.0f - kP.p));
  for (int64_t i = 0; i < n; ++i) {
    const double v = y.item(i);
    ASSERT_TRUE(v == 0.0 || v == double(kept_value)) << "element " << i << " = " << v;
    kept += v != 0.0;
    sum += v;
  }
  // Keep fraction ~ Binomial: standard error sqrt(p(1-p)/n) = 0.00145; E[y] = x = 1 with standard
  // error sqrt(p/(1-p)/n) = 0.00207. Allow 5 standard errors each.
  EXPECT_NEAR(double(kept) / double(n), 1.0 - kP.p, 5 * 0.00145);
  EXPECT_NEAR(sum / double(n), 1.0, 5 * 0.00207);
}

TEST(Dropout, MaskIsTheCounterRngRuleAndBackwardRegeneratesIt) {
  const int64_t n = 4096;
  const Tensor x = randn({n}, DType::f64, 1), dy = randn({n}, DType::f64, 2);
  Tensor y = poisoned({n}, DType::f64), dx = poisoned({n}, DType::f64);
  ops::dropout_forward(y, x, kP);
  ops::dropout_backward(dx, dy, kP);
  const CounterRng rng{kP.seed, kP.stream};
  const double scale = 1.0 / (1.0 - double(kP.p));
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng.uniform(uint64_t(i)) > kP.p;  // dropout.h: kept when uniform > p
    ASSERT_EQ(y.item(i), keep ? x.item(i) * scale : 0.0) << i;
    ASSERT_EQ(dx.item(i), keep ? dy.item(i) * scale : 0.0) << i;
  }
  // Another stream gives another mask.
  Tensor other = poisoned({n}, DType::f64);
  ops::dropout_forward(other, x, {kP.p, kP.seed, kP.stream + 1});
  EXPECT_FALSE(all_close(other, y, 0.0, 0.0));
}

// A shard with offset k draws elements [k, k + n) of the whole tensor's mask: how a sequence-
// parallel rank's rows get the same mask as in the unsplit layout.
TEST(Dropout, OffsetShardsDrawTheWholeTensorsMask) {
  const int64_t n = 1200, shards = 3, part = n / shards;
  const Tensor x = randn({n}, DType::f32, 11);
  Tensor whole = poisoned({n}, DType::f32);
  ops::dropout_forward(whole, x, kP);
  for (int64_t r = 0; r < shards; ++r) {
    DropoutParams p = kP;
    p.offset = uint64_t(r * part);
    Tensor y = poisoned({part}, DType::f32), dx = poisoned({part}, DType::f32);
    ops::dropout_forward(y, x.slice(r * part, (r + 1) * part), p);
    EXPECT_TRUE(all_close(y, whole.slice(r * part, (r + 1) * part), 0.0, 0.0)) << "shard " << r;
    ops::dropout_backward(dx, x.slice(r * part, (r + 1) * part), p);
    EXPECT_TRUE(all_close(dx, y, 0.0, 0.0)) << "shard " << r << " backward";
  }
}

TEST(Dropout, GradientMatchesFiniteDifferences) {
  Tensor x = randn({5, 2, 8}, DType::f64, 3);
  const Tensor r = randn(x.shape(), DType::f64, 4);
  const auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::f64);
    ops::dropout_forward(y, x, kP);
    return sum_product(y, r);
  };
  Tensor dx = poisoned(x.shape(), DType::f64);
  ops::dropout_backward(dx, r, kP);
  EXPECT_TRUE(grad_close(dx, numeric_grad(x, loss)));
}

TEST(Dropout, ZeroProbabilityCopiesAndInPlaceWorks) {
  const Tensor x = randn({64}, DType::bf16, 5);
  Tensor y = poisoned({64}, DType::bf16);
  ops::dropout_forward(y, x, {0.0f, 1, 2});
  EXPECT_TRUE(all_close(y, x, 0.0, 0.0));

  Tensor out = poisoned({64}, DType::bf16);
  ops::dropout_forward(out, x, kP);
  Tensor inplace = x.clone();
  ops::dropout_forward(inplace, inplace, kP);
  EXPECT_TRUE(all_close(inplace, out, 0.0, 0.0));
}

TEST(Dropout, LowerPrecisionMatchesF64) {
  const Tensor x = randn({256}, DType::f64, 6);
  Tensor ref = Tensor::empty({256}, DType::f64);
  ops::dropout_forward(ref, x, kP);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor y = poisoned({256}, dt);
    ops::dropout_forward(y, x.to(dt), kP);
    // One product by 1/(1-p) (itself rounded in f32) and the rounding of the result: factor 2.
    EXPECT_TRUE(matches_reference(y, ref, unit_roundoff(dt), 2.0)) << dtype_name(dt);
  }
}

TEST(Dropout, RejectsBadArguments) {
  const Tensor x = randn({16}, DType::f32, 7);
  Tensor y = Tensor::empty({16}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::dropout_forward(y, x, {1.0f, 0, 0}); }, "dropout probability"));
  EXPECT_TRUE(throws_error_naming([&] { ops::dropout_forward(y, x, {-0.1f, 0, 0}); }, "dropout probability"));
  Tensor wrong = Tensor::empty({4, 4}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::dropout_forward(wrong, x, kP); }, "dropout y"));
}
