// Known answers for the numpy random streams (megatron-compat.md sections 2.3 and 3; values
// produced by numpy itself) and cross-checks against std::mt19937, an independent MT19937.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "megatron/datasets/numpy_random.h"
#include "test_util.h"

using namespace megatron::datasets;
using megatron::testing::error_of;

TEST(NumpyRandomState, KnownAnswersForSeed1234) {
  NumpyRandomState rng(1234);
  EXPECT_EQ(rng.next_u32(), 822569775u);  // numpy.random.RandomState(1234): first raw word

  std::vector<int64_t> values(10);
  std::iota(values.begin(), values.end(), 0);
  NumpyRandomState shuffler(1234);
  shuffler.shuffle(std::span<int64_t>(values));  // RandomState(1234).shuffle(arange(10))
  EXPECT_EQ(values, (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

// shuffle draws each swap's partner ahead of the swap (to prefetch it): the result must stay the
// textbook loop's, for lengths below, at and above the lookahead and one past 2^20 (a progress call).
TEST(NumpyRandomState, ShuffleEqualsTheTextbookLoop) {
  for (const int64_t n : {0, 1, 2, 15, 16, 17, 33, 100000, (1 << 20) + 1}) {
    std::vector<uint32_t> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    std::iota(got.begin(), got.end(), 0u);
    std::iota(want.begin(), want.end(), 0u);
    NumpyRandomState fast(42), plain(42);
    int64_t progress_calls = 0;
    fast.shuffle(std::span<uint32_t>(got), [&](int64_t) { ++progress_calls; });
    for (int64_t i = n - 1; i >= 1; --i) std::swap(want[size_t(i)], want[size_t(plain.random_interval(uint64_t(i)))]);
    EXPECT_EQ(got, want) << "n = " << n;
    EXPECT_EQ(fast.next_u32(), plain.next_u32()) << "n = " << n << ": the streams drew different amounts";
    EXPECT_EQ(progress_calls, n > (1 << 20) ? 1 : 0) << "n = " << n;
  }
}

TEST(NumpyRandomState, SeedingAndOutputMatchStdMt19937) {
  // numpy seeds an integer with init_genrand, which is exactly how std::mt19937(seed) seeds;
  // 2000 outputs cross four twists.
  for (uint32_t seed : {0u, 1u, 1234u, 5489u, 0xffffffffu}) {
    NumpyRandomState ours(seed);
    std::mt19937 reference(seed);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(ours.next_u32(), reference()) << "seed " << seed << " draw " << i;
  }
}

TEST(NumpyRandomState, WideDrawsTakeTheHighWordFirst) {
  NumpyRandomState wide(42);
  std::mt19937 words(42);
  for (int i = 0; i < 10; ++i) {
    const uint64_t high = words(), low = words();
    EXPECT_EQ(wide.next_u64(), (high << 32) | low);
  }
}

TEST(NumpyRandomState, IntervalMasksAndRejects) {
  NumpyRandomState rng(7);
  std::mt19937 words(7);
  // max = 5: mask 7; draws whose low three bits exceed 5 are rejected and cost a word each.
  for (int i = 0; i < 200; ++i) {
    uint32_t expected = 0;
    do expected = words() & 7u;
    while (expected > 5u);
    ASSERT_EQ(rng.random_interval(5), expected) << "draw " << i;
  }
  EXPECT_EQ(rng.random_interval(0), 0u);  // no draw for max 0
  EXPECT_EQ(rng.next_u32(), words());
  // Above 32 bits, 64-bit words (two draws each) under a 33-bit mask.
  const uint64_t max = (uint64_t(1) << 32) + 5;
  for (int i = 0; i < 50; ++i) {
    uint64_t expected = 0;
    do {
      const uint64_t high = words(), low = words();
      expected = ((high << 32) | low) & ((uint64_t(1) << 33) - 1);
    } while (expected > max);
    ASSERT_EQ(rng.random_interval(max), expected) << "wide draw " << i;
  }
}

TEST(NumpyRandomState, RejectsSeedsNumpyRejects) {
  EXPECT_NE(error_of([] { NumpyRandomState(-1); }).find("outside [0, 2^32 - 1]"), std::string::npos);
  EXPECT_NE(error_of([] { NumpyRandomState(int64_t(1) << 32); }).find("4294967296"), std::string::npos);
}

TEST(NumpyGenerator, MockLengthsOfDefaultRng0) {
  // numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=numpy.int32): Megatron's
  // mock document lengths. The sum covers every draw, rejections included.
  NumpyGenerator rng(0);
  const std::vector<int32_t> lengths = rng.integers_i32(1, 4096, 100000);
  ASSERT_EQ(lengths.size(), 100000u);
  EXPECT_EQ(std::vector<int32_t>(lengths.begin(), lengths.begin() + 12),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331, 2660, 3738}));
  EXPECT_EQ(std::accumulate(lengths.begin(), lengths.end(), int64_t(0)), 204637097);
}

TEST(NumpyGenerator, Next32SplitsOneWordLowHalfFirst) {
  NumpyGenerator halves(5), whole(5);
  for (int i = 0; i < 4; ++i) {
    const uint64_t word = whole.next_u64();
    EXPECT_EQ(halves.next_u32(), uint32_t(word));
    EXPECT_EQ(halves.next_u32(), uint32_t(word >> 32));
  }
}

TEST(NumpyGenerator, SingleValueRangeDrawsNothing) {
  NumpyGenerator a(3), b(3);
  EXPECT_EQ(a.integers_i32(9, 10, 5), (std::vector<int32_t>(5, 9)));
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(error_of([&] { a.integers_i32(4, 4, 1); }).find("low must be below high"), std::string::npos);
}
