#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/ops/cross_entropy.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

constexpr int64_t kN = 10, kV = 7;

Tensor make_targets(int64_t n, int64_t vocab) {
  Tensor t = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = int32_t((i * 3 + 1) % vocab);
  return t;
}

DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

TEST(CrossEntropy, KnownAnswers) {
  // Uniform logits: every class has probability 1/V, loss ln V whatever the target.
  const Tensor uniform = filled({3, kV}, DType::f64, 2.5);
  Tensor losses = poisoned({3}, DType::f64), lse = poisoned({3}, DType::f64);
  ops::cross_entropy_forward(losses, lse, uniform, make_targets(3, kV));
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(losses.item(i), std::log(double(kV)), 1e-15);
    EXPECT_NEAR(lse.item(i), 2.5 + std::log(double(kV)), 1e-15);
  }
  // Logits [0, ln 2, ln 3]: probabilities 1/6, 2/6, 3/6, so target 2 costs ln 2.
  const Tensor logits = Tensor::from_vector({0.0f, float(std::log(2.0)), float(std::log(3.0))}, {1, 3}, DType::f64);
  Tensor one = Tensor::empty({1}, DType::f64), one_lse = Tensor::empty({1}, DType::f64);
  Tensor target = Tensor::from_vector({2}, {1}, DType::i32);
  ops::cross_entropy_forward(one, one_lse, logits, target);
  EXPECT_NEAR(one.item(0), std::log(2.0), 1e-7);  // the logits went through float
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesWithMaskAndScale) {
  Tensor logits = randn({kN, kV}, DType::f64, 1, 3.0);
  const Tensor targets = make_targets(kN, kV);
  Tensor mask = filled({kN}, DType::f32, 1.0);
  mask.set_item(2, 0.0);
  mask.set_item(7, 0.0);
  const float grad_scale = 0.25f;
  // L = grad_scale * sum_i mask_i loss_i: backward's dlogits is dL/dlogits.
  const auto loss = [&] {
    Tensor losses = Tensor::empty({kN}, DType::f64), lse = Tensor::empty({kN}, DType::f64);
    ops::cross_entropy_forward(losses, lse, logits, targets);
    return double(grad_scale) * sum_product(losses, mask);
  };
  Tensor losses = poisoned({kN}, DType::f64), lse = poisoned({kN}, DType::f64);
  ops::cross_entropy_forward(losses, lse, logits, targets);
  Tensor dlogits = poisoned({kN, kV}, DType::f64);
  ops::cross_entropy_backward(dlogits, logits, targets, lse, mask, grad_scale, {});
  EXPECT_TRUE(grad_close(dlogits, numeric_grad(logits, loss)));
  for (int64_t j = 0; j < kV; ++j) ASSERT_EQ(dlogits.item(2 * kV + j), 0.0) << "masked row";
}

TEST(CrossEntropy, InPlaceGradientEqualsSeparateBuffer) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor logits = randn({kN, kV}, dt, 2, 3.0), targets = make_targets(kN, kV);
    Tensor losses = Tensor::empty({kN}, DType::f32), lse = Tensor::empty({kN}, DType::f32);
    ops::cross_entropy_forward(losses, lse, logits, targets);
    Tensor separate = poisoned({kN, kV}, dt);
    ops::cross_entropy_backward(separate, logits, targets, lse, Tensor(), 1.0f, {});
    Tensor inplace = logits.clone();
    ops::cross_entropy_backward(inplace, inplace, targets, lse, Tensor(), 1.0f, {});  // dlogits aliases logits
    EXPECT_TRUE(all_close(inplace, separate, 0.0, 0.0)) << dtype_name(dt);
  }
}

TEST(CrossEntropy, LowerPrecisionMatchesF64) {
  const Tensor logits = randn({kN, kV}, DType::f64, 3, 3.0), targets = make_targets(kN, kV);
  const auto run = [&](DType dt) {
    std::vector<Tensor> outs{poisoned({kN}, stat_dtype(dt)), poisoned({kN}, stat_dtype(dt)), poisoned({kN, kV}, dt)};
    ops::cross_entropy_forward(outs[0], outs[1], logits.to(dt), targets);
    ops::cross_entropy_backward(outs[2], logits.to(dt), targets, outs[1], Tensor(), 0.5f, {});
    return outs;
  };
  const std::vector<Tensor> ref = run(DType::f64);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<Tensor> got = run(dt);
    // Losses and lse are f32 for every dtype: V = 7 exp terms summed, a log and a subtraction (V + 4).
    EXPECT_TRUE(matches_reference(got[0], ref[0], kUnitRoundoffF32, kV + 4)) << dtype_name(dt) << " losses";
    EXPECT_TRUE(matches_reference(got[1], ref[1], kUnitRoundoffF32, kV + 4)) << dtype_name(dt) << " lse";
    // dlogits: exp of (logit - lse) carries lse's error with |logit| <= ~10 amplification (about
    // 4 * 11 roundings); bf16/f16: one rounding of the result dominates: factor 2.
    const double factor = dt == DType::f32 ? 4.0 * (kV + 4) : 2.0;
    EXPECT_TRUE(matches_reference(got[2], ref[2], unit_roundoff(dt), factor)) << dtype_name(dt) << " dlogits";
  }
}

TEST(CrossEntropy, ParallelRunMatchesSerialRunBitwise) {
  const int64_t N = 256, V = 512;  // N * V above the serial threshold
  const Tensor logits = randn({N, V}, DType::f32, 5, 3.0), targets = make_targets(N, V);
  std::vector<Tensor> runs[2];
  for (int t : {0, 1}) {
    with_threads(t == 0 ? 1 : 2, [&] {
      Tensor losses = poisoned({N}, DType::f32), lse = poisoned({N}, DType::f32), dlogits = logits.clone();
      ops::cross_entropy_forward(losses, lse, logits, targets);
      ops::cross_entropy_backward(dlogits, dlogits, targets, lse, Tensor(), 1.0f, {});
      runs[t] = {losses, lse, dlogits};
    });
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(all_finite(runs[1][i])) << i;
    EXPECT_TRUE(all_close(runs[1][i], runs[0][i], 0.0, 0.0)) << i;
  }
}

// The vocab-parallel loss: R ranks each holding V/R columns give the whole-vocabulary losses, lse
// and, column for column, the whole-vocabulary gradient. Targets fall in every shard.
// Tolerances: f64 logits, the combine regroups the sum of exps (R partial sums, each rescaled by
// exp(m_r - M)): a few units of 2^-53 relative; 1e-14 is ~50 u. The gradient of a shard is the
// same formula on the same lse: bitwise equal.
TEST(CrossEntropy, VocabParallelShardsMatchTheWholeVocabulary) {
  const int64_t N = 9, V = 12;
  const Tensor logits = randn({N, V}, DType::f64, 6, 3.0), targets = make_targets(N, V);
  Tensor losses = poisoned({N}, DType::f64), lse = poisoned({N}, DType::f64);
  ops::cross_entropy_forward(losses, lse, logits, targets);
  Tensor dwhole = poisoned({N, V}, DType::f64);
  ops::cross_entropy_backward(dwhole, logits, targets, lse, Tensor(), 0.5f, {});
  for (const int64_t R : {2, 3, 4}) {
    const int64_t part = V / R;
    std::vector<Tensor> shards;
    Tensor partials = poisoned({R, 3, N}, DType::f64);
    for (int64_t r = 0; r < R; ++r) {
      Tensor shard = Tensor::empty({N, part}, DType::f64);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < part; ++j) shard.set_item(n * part + j, logits.item(n * V + r * part + j));
      Tensor partial = partials.select(r);
      ops::cross_entropy_partial_forward(partial, shard, targets, {.start = r * part, .size = V});
      shards.push_back(shard);
    }
    Tensor split_losses = poisoned({N}, DType::f64), split_lse = poisoned({N}, DType::f64);
    ops::cross_entropy_combine(split_losses, split_lse, partials);
    EXPECT_TRUE(all_close(split_losses, losses, 1e-14, 0.0)) << R << " ranks";
    EXPECT_TRUE(all_close(split_lse, lse, 1e-14, 0.0)) << R << " ranks";
    for (int64_t r = 0; r < R; ++r) {
      Tensor dshard = poisoned({N, part}, DType::f64);
      ops::cross_entropy_backward(dshard, shards[size_t(r)], targets, lse, Tensor(), 0.5f,
                                  {.start = r * part, .size = V});
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < part; ++j)
          ASSERT_EQ(dshard.item(n * part + j), dwhole.item(n * V + r * part + j)) << R << " ranks, rank " << r;
    }
  }
}

TEST(CrossEntropy, RejectsBadVocabShards) {
  const Tensor logits = randn({kN, 4}, DType::f32, 7);
  Tensor partial = Tensor::empty({3, kN}, DType::f32);
  Tensor targets = make_targets(kN, 8);
  ops::cross_entropy_partial_forward(partial, logits, targets, {.start = 4, .size = 8});  // the upper half
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::cross_entropy_partial_forward(partial, logits, targets, {.start = 6, .size = 8}); },
      "columns [6, 10) do not lie in a vocabulary of 8 ids"));
  targets.data<int32_t>()[2] = 8;  // in no rank's shard
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::cross_entropy_partial_forward(partial, logits, targets, {.start = 4, .size = 8}); },
      "cross_entropy target 8 at row 2 is outside the vocabulary [0, 8)"));
  Tensor partials = Tensor::empty({2, 2, kN}, DType::f32), losses = Tensor::empty({kN}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::cross_entropy_combine(losses, losses, partials); }, "(R,3,N)"));
}

TEST(CrossEntropy, RejectsOutOfRangeTargetsAndBadShapes) {
  const Tensor logits = randn({kN, kV}, DType::f32, 4);
  Tensor losses = Tensor::empty({kN}, DType::f32), lse = Tensor::empty({kN}, DType::f32);
  for (int32_t bad : {-1, int32_t(kV)}) {
    Tensor targets = make_targets(kN, kV);
    targets.data<int32_t>()[5] = bad;
    EXPECT_TRUE(throws_error_naming([&] { ops::cross_entropy_forward(losses, lse, logits, targets); },
                                    "outside the vocabulary"))
        << bad;
    Tensor dlogits = Tensor::empty({kN, kV}, DType::f32);
    EXPECT_TRUE(
        throws_error_naming([&] { ops::cross_entropy_backward(dlogits, logits, targets, lse, Tensor(), 1.0f, {}); },
                            "outside the vocabulary"));
  }
  Tensor short_losses = Tensor::empty({kN - 1}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::cross_entropy_forward(short_losses, lse, logits, make_targets(kN, kV)); },
                                  "cross_entropy losses"));
  Tensor bf16_lse = Tensor::empty({kN}, DType::bf16);
  EXPECT_TRUE(throws_error_naming([&] { ops::cross_entropy_forward(losses, bf16_lse, logits, make_targets(kN, kV)); },
                                  "cross_entropy lse"));
}
