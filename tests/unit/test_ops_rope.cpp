#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <vector>

#include "megatron/ops/attention.h"
#include "megatron/ops/rope.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::RopeParams;

namespace {

constexpr int64_t kS = 5, kB = 2, kH = 3, kD = 8;

// Megatron's formulation, written independently of the kernel's pair loop:
//   emb = [freqs, freqs] (or each freq repeated twice when interleaved), freqs = pos * inv_freq (float32)
//   y = x cos(emb) + rotate_half(x) sin(emb) on the first rot_dim channels,
//   rotate_half([x1, x2]) = [-x2, x1]  (interleaved: [-x1, x0, -x3, x2, ...])
Tensor reference_rope(const Tensor& x, const RopeParams& p) {
  const int64_t S = x.dim(0), B = x.dim(1), H = x.dim(2), D = x.dim(3);
  const auto rot = int64_t(double(D) * double(p.percent));
  Tensor y = x.clone();
  for (int64_t s = 0; s < S; ++s) {
    std::vector<double> emb(static_cast<size_t>(rot));
    for (int64_t c = 0; c < rot; ++c) {
      const int64_t j = p.interleaved ? c / 2 : c % (rot / 2);
      const float inv_freq = 1.0f / std::pow(p.base, float(2 * j) / float(rot));
      emb[size_t(c)] = double(float(p.position_offset + s) * inv_freq);
    }
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t base = (s * B * H + bh) * D;
      for (int64_t c = 0; c < rot; ++c) {
        double rotated;
        if (p.interleaved) {
          rotated = c % 2 == 0 ? -x.item(base + c + 1) : x.item(base + c - 1);
        } else {
          rotated = c < rot / 2 ? -x.item(base + c + rot / 2) : x.item(base + c - rot / 2);
        }
        y.set_item(base + c, x.item(base + c) * std::cos(emb[size_t(c)]) + rotated * std::sin(emb[size_t(c)]));
      }
    }
  }
  return y;
}

const RopeParams kVariants[] = {
    {10000.0f, 1.0f, false, 0},
    {10000.0f, 0.5f, false, 3},
    {500000.0f, 1.0f, true, 7},
    {10000.0f, 0.5f, true, 0},
};

}  // namespace

TEST(Rope, KnownRotation) {
  // D = 4, position 1: inv_freq[0] = 1, so the first pair turns by exactly 1 radian.
  const Tensor x = Tensor::from_vector({1, 0, 0, 0}, {1, 1, 1, 4}, DType::f64);
  Tensor y = Tensor::empty({1, 1, 1, 4}, DType::f64);
  ops::rope_forward(y, x, {10000.0f, 1.0f, false, 1});  // pairs (0, 2), (1, 3)
  EXPECT_DOUBLE_EQ(y.item(0), std::cos(1.0));
  EXPECT_DOUBLE_EQ(y.item(1), 0.0);
  EXPECT_DOUBLE_EQ(y.item(2), std::sin(1.0));
  EXPECT_DOUBLE_EQ(y.item(3), 0.0);
  ops::rope_forward(y, x, {10000.0f, 1.0f, true, 1});  // pairs (0, 1), (2, 3)
  EXPECT_DOUBLE_EQ(y.item(0), std::cos(1.0));
  EXPECT_DOUBLE_EQ(y.item(1), std::sin(1.0));
  EXPECT_DOUBLE_EQ(y.item(2), 0.0);
}

TEST(Rope, MatchesMegatronFormulation) {
  const Tensor x = randn({kS, kB, kH, kD}, DType::f64, 1);
  for (const RopeParams& p : kVariants) {
    Tensor y = poisoned(x.shape(), DType::f64);
    ops::rope_forward(y, x, p);
    // Same angles, same cos/sin, a different order of two products: a few ulp.
    EXPECT_TRUE(matches_reference(y, reference_rope(x, p), 0x1p-53, 4.0))
        << "percent " << p.percent << " interleaved " << p.interleaved;
  }
}

TEST(Rope, PartialRotaryLeavesTailAndInverseRestoresInput) {
  const Tensor x = randn({kS, kB, kH, kD}, DType::f64, 2);
  for (const RopeParams& p : kVariants) {
    Tensor y = poisoned(x.shape(), DType::f64);
    ops::rope_forward(y, x, p);
    const auto rot = int64_t(kD * p.percent);
    for (int64_t row = 0; row < x.numel() / kD; ++row)
      for (int64_t c = rot; c < kD; ++c) ASSERT_EQ(y.item(row * kD + c), x.item(row * kD + c)) << "tail channel " << c;
    // Rotations are orthogonal: backward (the inverse rotation) of forward gives x back.
    Tensor back = poisoned(x.shape(), DType::f64);
    ops::rope_backward(back, y, p);
    EXPECT_TRUE(all_close(back, x, 1e-15, 1e-15));
  }
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  for (const RopeParams& p : kVariants) {
    Tensor x = randn({kS, kB, kH, kD}, DType::f64, 3);
    const Tensor r = randn(x.shape(), DType::f64, 4);
    const auto loss = [&] {
      Tensor y = Tensor::empty(x.shape(), DType::f64);
      ops::rope_forward(y, x, p);
      return sum_product(y, r);
    };
    Tensor dx = poisoned(x.shape(), DType::f64);
    ops::rope_backward(dx, r, p);
    EXPECT_TRUE(grad_close(dx, numeric_grad(x, loss))) << "percent " << p.percent << " interleaved " << p.interleaved;
  }
}

TEST(Rope, InPlaceEqualsOutOfPlace) {
  const Tensor x = randn({kS, kB, kH, kD}, DType::bf16, 5);
  const RopeParams p{10000.0f, 0.5f, false, 2};
  Tensor out = poisoned(x.shape(), DType::bf16);
  ops::rope_forward(out, x, p);
  Tensor inplace = x.clone();
  ops::rope_forward(inplace, inplace, p);
  EXPECT_TRUE(all_close(inplace, out, 0.0, 0.0));
}

TEST(Rope, LowerPrecisionMatchesF64) {
  const Tensor x = randn({kS, kB, kH, kD}, DType::f64, 6), dy = randn({kS, kB, kH, kD}, DType::f64, 7);
  for (const RopeParams& p : kVariants) {
    Tensor y64 = Tensor::empty(x.shape(), DType::f64), dx64 = Tensor::empty(x.shape(), DType::f64);
    ops::rope_forward(y64, x, p);
    ops::rope_backward(dx64, dy, p);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      Tensor y = poisoned(x.shape(), dt), dx = poisoned(x.shape(), dt);
      ops::rope_forward(y, x.to(dt), p);
      ops::rope_backward(dx, dy.to(dt), p);
      // Same float32 angles; cosf/sinf within 1 ulp of cos/sin of that angle, then two products and
      // a sum: factor 4 in f32. bf16/f16: one rounding of the result dominates: factor 2.
      const double factor = dt == DType::f32 ? 4.0 : 2.0;
      EXPECT_TRUE(matches_reference(y, y64, unit_roundoff(dt), factor)) << dtype_name(dt) << " y";
      EXPECT_TRUE(matches_reference(dx, dx64, unit_roundoff(dt), factor)) << dtype_name(dt) << " dx";
    }
  }
}

TEST(Rope, RejectsBadArguments) {
  const Tensor x = randn({kS, kB, kH, 6}, DType::f32, 1);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_forward(y, x, {10000.0f, 0.5f, false, 0}); }, "must be even"));
  const Tensor x3 = randn({kS, kB, 6}, DType::f32, 2);
  Tensor y3 = Tensor::empty(x3.shape(), DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_forward(y3, x3, {}); }, "rope x"));
  Tensor wrong = Tensor::empty({kS, kB, kH, 8}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_forward(wrong, x, {}); }, "rope y"));
}

TEST(Rope, LlamaThreeScalingMatchesKnownAnswers) {
  // interop-formats.md 7.6, computed in double: head dim 128, theta 500000, factor 8. Ours runs in
  // float32 (as Megatron and transformers do): pow, a division and the blend cost a few ulp, so
  // 1e-6 relative is ample and far below the changes the scaling makes (x0.64 .. x0.125).
  const RopeParams p{.base = 500000.0f, .scaling_factor = 8.0f};
  const std::pair<int64_t, double> known[] = {
      {1, 0.814617234}, {30, 0.00137189357}, {40, 3.4281022e-5}, {63, 3.06892599e-7}};
  for (const auto& [j, expected] : known) {
    EXPECT_NEAR(ops::rope_inv_freq(j, 128, p), expected, 1e-6 * expected) << "inv_freq[" << j << "]";
  }
  const RopeParams unscaled{.base = 500000.0f};
  EXPECT_NEAR(ops::rope_inv_freq(30, 128, unscaled), 0.00213111954, 1e-6 * 0.00213111954);
}

// --rotary-seq-len-interpolation-factor f: position p turns by the angles of p / f. Known answer:
// D = 4, position 2, f = 2: the first pair (inv_freq 1) turns by exactly 1 radian, as position 1
// does unscaled. Against Megatron's formulation (positions times 1/f, then times inv_freq) at
// f = 3, where the two roundings differ: angles below 10 rad agree to a few float ulp (1e-6 rad).
TEST(Rope, InterpolationFactorTurnsPositionPAsPOverTheFactor) {
  const Tensor x = Tensor::from_vector({1, 0, 0, 0}, {1, 1, 1, 4}, DType::f64);
  Tensor y = Tensor::empty({1, 1, 1, 4}, DType::f64);
  ops::rope_forward(y, x, {.position_offset = 2, .seq_len_interpolation_factor = 2.0f});
  EXPECT_DOUBLE_EQ(y.item(0), std::cos(1.0));
  EXPECT_DOUBLE_EQ(y.item(2), std::sin(1.0));

  const RopeParams p{.position_offset = 20, .seq_len_interpolation_factor = 3.0f};
  const Tensor xs = randn({kS, kB, kH, kD}, DType::f64, 4);
  Tensor ys = poisoned(xs.shape(), DType::f64);
  ops::rope_forward(ys, xs, p);
  for (int64_t s = 0; s < kS; ++s)
    for (int64_t c = 0; c < kD / 2; ++c) {
      const float inv_freq = 1.0f / std::pow(p.base, float(2 * c) / float(kD));
      const double angle = double(float(float(p.position_offset + s) * (1.0f / 3.0f)) * inv_freq);
      const double x0 = xs.item(s * kB * kH * kD + c), x1 = xs.item(s * kB * kH * kD + c + kD / 2);
      EXPECT_NEAR(ys.item(s * kB * kH * kD + c), x0 * std::cos(angle) - x1 * std::sin(angle), 1e-5);
      EXPECT_NEAR(ys.item(s * kB * kH * kD + c + kD / 2), x1 * std::cos(angle) + x0 * std::sin(angle), 1e-5);
    }
  EXPECT_EQ(ops::rope_inv_freq(1, 8, p), ops::rope_inv_freq(1, 8, {}) / 3.0f);
}

namespace {

// Split + rope of q and k + merge, through the separate ops: the definition of rope_*_qkv.
Tensor rope_qkv_by_split(const Tensor& qkv, int64_t num_heads, const RopeParams& p, bool inverse) {
  ops::SplitQkv s = ops::empty_split_qkv(qkv, num_heads);
  ops::qkv_split(s.q, s.k, s.v, qkv);
  for (Tensor* t : {&s.q, &s.k}) inverse ? ops::rope_backward(*t, *t, p) : ops::rope_forward(*t, *t, p);
  Tensor merged = poisoned(qkv.shape(), qkv.dtype());
  ops::qkv_merge(merged, s.q, s.k, s.v);
  return merged;
}

}  // namespace

// The fused op runs the separate op's per-head loop on the query and key heads in place, so it
// equals split + rope + merge bit for bit: GQA (r = 3), MHA (r = 1) and one kv head (r = 4), every
// rotary variant and Llama-3's scaling, forward and backward, f32, bf16 and f64.
TEST(RopeQkv, EqualsSplitRopeMergeBitForBit) {
  const int64_t S = 6, B = 2, D = 8;
  const std::pair<int64_t, int64_t> heads_groups[] = {{6, 2}, {3, 3}, {4, 1}};
  std::vector<RopeParams> variants(std::begin(kVariants), std::end(kVariants));
  variants.push_back({.base = 500000.0f, .position_offset = 9000, .scaling_factor = 8.0f});
  uint64_t seed = 20;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (const auto& [NH, G] : heads_groups) {
      for (const RopeParams& p : variants) {
        for (const bool inverse : {false, true}) {
          const Tensor qkv = randn({S, B, G, (NH / G + 2) * D}, dt, ++seed);
          const Tensor expected = rope_qkv_by_split(qkv, NH, p, inverse);
          Tensor fused = qkv.clone();
          inverse ? ops::rope_backward_qkv(fused, NH, p) : ops::rope_forward_qkv(fused, NH, p);
          EXPECT_TRUE(all_close(fused, expected, 0.0, 0.0))
              << dtype_name(dt) << " NH " << NH << " G " << G << " percent " << p.percent << " interleaved "
              << p.interleaved << " offset " << p.position_offset << (inverse ? " backward" : " forward");
        }
      }
    }
  }
}

TEST(RopeQkv, HandWorkedGroupOfTwoQueryHeads) {
  // One position at offset 1, G = 1, NH = 2, D = 4: heads [q0, q1, k, v]. Pairs (0, 2) turn by
  // inv_freq[0] = 1 radian, pairs (1, 3) by inv_freq[1] = 1/100 (the float32 0.01f).
  Tensor qkv = Tensor::from_vector({1, 0, 0, 0,   // q0
                                    0, 0, 1, 0,   // q1
                                    0, 1, 0, 0,   // k
                                    1, 2, 3, 4},  // v
                                   {1, 1, 1, 16}, DType::f64);
  const RopeParams p{10000.0f, 1.0f, false, 1};
  ops::rope_forward_qkv(qkv, 2, p);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(double(0.01f)), s2 = std::sin(double(0.01f));
  const double expected[] = {c1,  0,  s1, 0,   // q0: (1, 0) turns to (cos 1, sin 1)
                             -s1, 0,  c1, 0,   // q1: (0, 1) turns to (-sin 1, cos 1)
                             0,   c2, 0,  s2,  // k: its second pair (1, 0) turns by 0.01f
                             1,   2,  3,  4};  // v: untouched
  for (int64_t i = 0; i < 16; ++i) EXPECT_DOUBLE_EQ(qkv.item(i), expected[i]) << "channel " << i;
  // The inverse rotation gives the input back (an orthogonal map; a rounding or two in f64).
  ops::rope_backward_qkv(qkv, 2, p);
  const double input[] = {1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 2, 3, 4};
  for (int64_t i = 0; i < 16; ++i) EXPECT_NEAR(qkv.item(i), input[i], 1e-15) << "channel " << i;
}

TEST(RopeQkv, RejectsBadArguments) {
  Tensor qkv = Tensor::zeros({2, 1, 2, 5 * 8}, DType::f32);  // NH = 6 over G = 2: (3 + 2) * 8
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_forward_qkv(qkv, 8, {}); }, "rope qkv"));  // needs 6 * HS
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_forward_qkv(qkv, 5, {}); }, "NH % G"));
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_backward_qkv(qkv, 6, {10000.0f, 0.375f, false, 0}); }, "even"));
  Tensor flat = Tensor::zeros({2, 1, 40}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::rope_backward_qkv(flat, 6, {}); }, "rope dqkv"));
}
