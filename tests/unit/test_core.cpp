#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "megatron/core/dtype.h"
#include "megatron/core/memory.h"
#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "test_util.h"

using namespace megatron;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3F80);
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float(bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(float(bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, F16KnownEncodings) {
  EXPECT_EQ(f16(1.0f).bits, 0x3C00);
  EXPECT_EQ(f16(-2.0f).bits, 0xC000);
  EXPECT_EQ(f16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(f16(65520.0f).bits, 0x7C00);                // rounds up to infinity
  EXPECT_EQ(f16(5.960464477539063e-08f).bits, 0x0001);  // smallest subnormal 2^-24
  EXPECT_EQ(f16(0.0f).bits, 0x0000);
  // Every half value survives a round trip through float.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float f = f16::to_float(uint16_t(h));
    ASSERT_EQ(f16(f).bits, h) << "half bits " << h;
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3}, DType::f32);
  Tensor row = t.slice(1, 3);
  EXPECT_EQ(row.shape(), (Shape{2, 3}));
  row.set_item(0, 5.0);
  EXPECT_EQ(t.item(3), 5.0);
  EXPECT_EQ(t.select(1).shape(), (Shape{3}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{12}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.slice(2, 5), Error);
  EXPECT_THROW(t.data<bf16>(), Error);
}

TEST(Tensor, ReleasedMemoryIsGivenBackAndViewsWorkAgainOnceReacquired) {
  Tensor buffer = Tensor::zeros({1 << 20}, DType::f32);
  Tensor view = buffer.slice(1000, 2000);
  const size_t held = memory_stats(Device::cpu()).current_bytes;
  buffer.release_memory();
  EXPECT_FALSE(view.memory_held());
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, held - buffer.nbytes()) << "the views keep no memory";
  EXPECT_NE(megatron::testing::error_of([&] { view.item(0); }).find("memory was released"), std::string::npos);
  buffer.release_memory();  // a second release is a no-op
  buffer.reacquire_memory();
  EXPECT_TRUE(view.memory_held());
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, held);
  view.fill(2.0);
  EXPECT_EQ(buffer.item(1500), 2.0) << "the view sees the new memory";
  EXPECT_NE(megatron::testing::error_of([&] { view.release_memory(); }).find("on a view"), std::string::npos);
}

TEST(Tensor, ReleasedFromTheStartTakesMemoryOnlyWhenReacquired) {
  const size_t held = memory_stats(Device::cpu()).current_bytes;
  Tensor buffer = Tensor::released({1 << 20}, DType::f32);
  Tensor view = buffer.slice(10, 20);
  EXPECT_EQ(buffer.shape(), (Shape{1 << 20}));
  EXPECT_FALSE(view.memory_held());
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, held);
  EXPECT_NE(megatron::testing::error_of([&] { view.item(0); }).find("memory was released"), std::string::npos);
  buffer.reacquire_memory();
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, held + buffer.nbytes());
  view.fill(3.0);
  EXPECT_EQ(buffer.item(15), 3.0);
}

TEST(Tensor, ConvertingCopy) {
  Tensor a = Tensor::from_vector({1.0f, 2.5f, -3.0f}, {3});
  Tensor b = a.to(DType::bf16);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1.0f, 2.5f, -3.0f}));
  Tensor c = a.to(DType::i32);
  EXPECT_EQ(c.data<int32_t>()[2], -3);
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123 known-answer vectors for philox4x32-10.
  Philox4x32 zero = philox4x32_10(0, 0, 0);
  EXPECT_EQ(zero.x[0], 0x6627e8d5u);
  EXPECT_EQ(zero.x[1], 0xe169c58du);
  EXPECT_EQ(zero.x[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.x[3], 0x9b00dbd8u);
  Philox4x32 ones = philox4x32_10(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
  EXPECT_EQ(ones.x[0], 0x408f276du);
  EXPECT_EQ(ones.x[1], 0x41c83b0eu);
  EXPECT_EQ(ones.x[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.x[3], 0x6d5451fdu);
}

TEST(Rng, NormalMoments) {
  CounterRng rng{1234, stream_id("w")};
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal(uint64_t(i));
    sum += x;
    sq += x * x;
  }
  // Standard errors: mean 1/sqrt(n) = 0.0022, variance sqrt(2/n) = 0.0032; allow 5 sigma.
  EXPECT_NEAR(sum / n, 0.0, 0.011);
  EXPECT_NEAR(sq / n, 1.0, 0.016);
}

TEST(Rng, HostRngUniformIntInRangeAndReproducible) {
  HostRng a(7), b(7);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.uniform_int(10);
    EXPECT_LT(x, 10u);
    EXPECT_EQ(x, b.uniform_int(10));
  }
  HostRng c(7);
  c.set_state(a.state());
  EXPECT_EQ(c.next_u64(), a.next_u64());
}
