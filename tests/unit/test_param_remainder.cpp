// The f32 master as a bf16 parameter and a 16-bit remainder (core/param_remainder.h): the pair must
// give back every f32 bit pattern it can be asked to hold, and the bf16 half must be the
// round-to-nearest-even bf16 (the cast the masters' compute copy otherwise gets) except at exact
// ties, which round away from zero.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>

#include "megatron/core/dtype.h"
#include "megatron/core/param_remainder.h"

using namespace megatron;

namespace {
// Top halves around the edges: zero, the smallest subnormal, one, the largest finite, infinity less
// one step, their negatives, odd and even ones (ties go one way for both).
const uint16_t kTops[] = {0x0000, 0x0001, 0x0002, 0x3f80, 0x3f81, 0x4049, 0x7f7e, 0x7f7f,
                          0x8000, 0x8001, 0xbf80, 0xbf81, 0xc0a3, 0xff7e, 0xff7f};
}  // namespace

TEST(ParamRemainder, SplitThenJoinGivesBackEveryLowHalf) {
  for (const uint16_t top : kTops) {
    for (uint32_t low = 0; low <= 0xffffu; ++low) {
      const uint32_t bits = (uint32_t(top) << 16) | low;
      const SplitMaster s = split_master(bits);
      ASSERT_EQ(join_master(s.param, s.remainder), bits) << std::hex << "bits 0x" << bits;
    }
  }
}

TEST(ParamRemainder, ParamIsTheNearestBf16WithTiesAwayFromZero) {
  for (const uint16_t top : kTops) {
    if ((top & 0x7fffu) == 0x7f7fu) continue;  // rounds up to infinity: checked below
    for (uint32_t low = 0; low <= 0xffffu; low += 0x11u) {
      const uint32_t bits = (uint32_t(top) << 16) | low;
      const float master = std::bit_cast<float>(bits);
      const uint16_t param = split_master(master).param;
      if (low == 0x8000u) {
        EXPECT_EQ(param, uint16_t(top + 1)) << std::hex << "tie 0x" << bits;  // away from zero, odd top or even
      } else {
        EXPECT_EQ(param, bf16(master).bits) << std::hex << "bits 0x" << bits;
      }
    }
  }
  // Above the largest finite bf16 by half a step or more: infinity, as round-to-nearest gives.
  EXPECT_EQ(split_master(0x7f7f8000u).param, 0x7f80u);
  EXPECT_EQ(split_master(0xff7fc000u).param, 0xff80u);
  // Exact values (low half zero) are the bf16 parameter itself and a zero remainder.
  EXPECT_EQ(split_master(1.5f).param, bf16(1.5f).bits);
  EXPECT_EQ(split_master(1.5f).remainder, 0u);
}
