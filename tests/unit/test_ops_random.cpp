// ops::fill_normal on the CPU: element i is CounterRng::normal(offset + i) rounded to the dtype, a
// shard filled at its offset equals that part of the whole, and the values are standard normal.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/ops/random.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

const ops::RandomParams kP{.seed = 11, .stream = stream_id("random-test"), .offset = 0};

}  // namespace

TEST(FillNormal, ElementIIsTheCounterRngNormalOfItsIndex) {
  const CounterRng rng{kP.seed, kP.stream};
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Tensor t = poisoned({1000}, dt);
    ops::fill_normal(t, kP);
    for (int64_t i = 0; i < t.numel(); ++i) {
      Tensor one = Tensor::empty({1}, dt);
      one.set_item(0, double(rng.normal(uint64_t(i))));  // rounded to dt as the op rounds
      ASSERT_EQ(t.item(i), one.item(0)) << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(FillNormal, AShardAtItsOffsetEqualsThatPartOfTheWhole) {
  Tensor whole = poisoned({4, 300}, DType::f32), shard = poisoned({2, 300}, DType::f32);
  ops::fill_normal(whole, kP);
  ops::RandomParams p = kP;
  p.offset = 2 * 300;
  ops::fill_normal(shard, p);
  for (int64_t i = 0; i < shard.numel(); ++i) ASSERT_EQ(shard.item(i), whole.item(600 + i)) << "element " << i;
}

TEST(FillNormal, MeanZeroVarianceOne) {
  const int64_t n = int64_t(1) << 16;
  Tensor t = poisoned({n}, DType::f32);
  ops::fill_normal(t, kP);
  double sum = 0.0, squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sum += t.item(i);
    squares += t.item(i) * t.item(i);
  }
  // Standard errors for n = 65536 normal samples: the mean 1/sqrt(n) = 0.0039, the second moment
  // sqrt(2/n) = 0.0055; five of each.
  EXPECT_NEAR(sum / double(n), 0.0, 5 * 0.0039);
  EXPECT_NEAR(squares / double(n), 1.0, 5 * 0.0055);
}
