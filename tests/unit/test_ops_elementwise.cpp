#include <gtest/gtest.h>

#include "megatron/ops/elementwise.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

TEST(Elementwise, AddInPlaceAndRoundsOnce) {
  const Tensor a = randn({6, 5}, DType::f64, 1), b = randn({6, 5}, DType::f64, 2);
  Tensor ref = poisoned({6, 5}, DType::f64);
  ops::add(ref, a, b);
  for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_EQ(ref.item(i), a.item(i) + b.item(i));
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor residual = a.to(dt);
    ops::add(residual, residual, b.to(dt));  // out aliases a: the residual add
    // Exact inputs, one rounding of the sum: at most u |sum|, or half the subnormal spacing for a
    // sum below the normal range (f16: 2^-25; negligible for f32 and bf16).
    const double atol = dt == DType::f16 ? 0x1p-25 : 0.0;
    EXPECT_TRUE(all_close(residual, ref, unit_roundoff(dt), atol)) << dtype_name(dt);
  }
}

TEST(Elementwise, AddScaledAccumulatesAcrossDtypes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = randn({40}, dt, 3);
    const Tensor out0 = randn({40}, DType::f32, 4);
    Tensor out = out0.clone();
    ops::add_scaled(out, x, 0.5f);  // an fp32 accumulator += 0.5 * a 16-bit tensor
    for (int64_t i = 0; i < out.numel(); ++i)
      ASSERT_EQ(out.item(i), double(float(out0.item(i) + 0.5 * x.item(i)))) << dtype_name(dt) << " " << i;
  }
}

TEST(Elementwise, ScaleInPlace) {
  Tensor x = randn({17}, DType::f64, 5);
  const Tensor x0 = x.clone();
  ops::scale(x, x, -3.0f);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.item(i), -3.0 * x0.item(i));
}

TEST(Elementwise, CastRoundsLikeTheStorageTypes) {
  const Tensor x = Tensor::from_vector({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65520.0f, -2.5f}, {4});
  Tensor b = poisoned({4}, DType::bf16), h = poisoned({4}, DType::f16), d = poisoned({4}, DType::f64);
  ops::cast(b, x);
  ops::cast(h, x);
  ops::cast(d, b);
  for (int64_t i = 0; i < 4; ++i) {
    const float v = float(x.item(i));
    EXPECT_EQ(b.data<bf16>()[i].bits, bf16(v).bits) << i;  // round to nearest even (dtype.h)
    EXPECT_EQ(h.data<f16>()[i].bits, f16(v).bits) << i;
    EXPECT_EQ(d.item(i), double(float(bf16(v)))) << i;  // widening is exact
  }
}

TEST(Elementwise, Transpose01MatchesIndexArithmetic) {
  const int64_t d0 = 3, d1 = 4, rest = 2;
  Tensor in = Tensor::empty({d0, d1, rest}, DType::f32);
  for (int64_t i = 0; i < in.numel(); ++i) in.set_item(i, double(i));
  Tensor out = poisoned({d1, d0, rest}, DType::f32);
  ops::transpose01(out, in);
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      for (int64_t c = 0; c < rest; ++c) ASSERT_EQ(out.item((j * d0 + i) * rest + c), in.item((i * d1 + j) * rest + c));

  // Tokens (B,S) i32 -> (S,B): any dtype.
  Tensor tokens = Tensor::empty({2, 3}, DType::i32);
  for (int32_t i = 0; i < 6; ++i) tokens.data<int32_t>()[i] = 10 * (i / 3) + i % 3;  // [[0,1,2],[10,11,12]]
  Tensor sb = Tensor::empty({3, 2}, DType::i32);
  ops::transpose01(sb, tokens);
  const int32_t expected[] = {0, 10, 1, 11, 2, 12};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(sb.data<int32_t>()[i], expected[i]) << i;
}

TEST(Elementwise, RejectsBadArguments) {
  const Tensor a = randn({4, 3}, DType::f32, 1);
  Tensor out = Tensor::empty({5}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::add(out, a, a); }, "add out"));
  Tensor bf = Tensor::empty({4, 3}, DType::bf16);
  EXPECT_TRUE(throws_error_naming([&] { ops::add(bf, a, a); }, "add out"));
  Tensor same_shape = Tensor::empty({4, 3}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::transpose01(same_shape, a); }, "transpose01 out"));
  Tensor square = randn({3, 3}, DType::f32, 2);
  EXPECT_TRUE(throws_error_naming([&] { ops::transpose01(square, square); }, "in place"));
  Tensor ints = Tensor::empty({4, 3}, DType::i32);
  EXPECT_TRUE(throws_error_naming([&] { ops::cast(ints, a); }, "not supported"));
}
