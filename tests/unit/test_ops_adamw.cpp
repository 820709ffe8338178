#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "megatron/core/param_remainder.h"
#include "megatron/ops/adamw.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::AdamWParams;

namespace {

struct State {
  Tensor master, m, v;
};

State make_state(const std::vector<float>& p, DType dt) {
  const auto n = int64_t(p.size());
  return {Tensor::from_vector(p, {n}, dt), Tensor::zeros({n}, dt), Tensor::zeros({n}, dt)};
}

// torch.optim.AdamW by hand, in double, for one element.
struct HandAdam {
  double p, m = 0.0, v = 0.0;
  void step(double grad, const AdamWParams& a) {
    const double g = grad * a.grad_scale, b1 = a.beta1, b2 = a.beta2;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double m_hat = m / (1 - std::pow(b1, double(a.step))), v_hat = v / (1 - std::pow(b2, double(a.step)));
    p = p - double(a.lr) * (m_hat / (std::sqrt(v_hat) + double(a.eps)) + double(a.weight_decay) * p);
  }
};

const std::vector<float> kParams{1.0f, -0.5f, 0.25f, 2.0f};
const std::vector<std::vector<float>> kGrads{
    {0.5f, -1.0f, 0.0f, 3.0f}, {0.25f, 2.0f, -1.0f, 3.0f}, {-1.0f, 0.5f, 1.0f, 0.1f}};

}  // namespace

TEST(AdamW, FirstStepMovesEachWeightByAboutLr) {
  // Step 1 from zero moments: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) = lr sign(g).
  State s = make_state({1.0f}, DType::f64);
  Tensor grad = Tensor::from_vector({0.5f}, {1}, DType::f64), none;
  ops::adamw_step(s.master, s.m, s.v, grad, none, {0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1});
  EXPECT_NEAR(s.master.item(0), 0.9, 1e-7);
}

TEST(AdamW, ThreeStepsMatchHandComputedTorchFormula) {
  for (DType dt : {DType::f64, DType::f32}) {
    State s = make_state(kParams, dt);
    std::vector<HandAdam> hand;
    for (float p : kParams) hand.push_back({p});
    Tensor none;
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWParams a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t};
      const Tensor grad = Tensor::from_vector(kGrads[size_t(t - 1)], {4}, dt);
      ops::adamw_step(s.master, s.m, s.v, grad, none, a);
      for (size_t i = 0; i < hand.size(); ++i) hand[i].step(kGrads[size_t(t - 1)][i], a);
    }
    Tensor expect_p = Tensor::empty({4}, DType::f64), expect_m = Tensor::empty({4}, DType::f64);
    Tensor expect_v = Tensor::empty({4}, DType::f64);
    for (int64_t i = 0; i < 4; ++i) {
      expect_p.set_item(i, hand[size_t(i)].p);
      expect_m.set_item(i, hand[size_t(i)].m);
      expect_v.set_item(i, hand[size_t(i)].v);
    }
    // f64: same formula, a few roundings. f32: each step adds ~10 roundings to m, v and the
    // update; over 3 steps, factor 32 of u against the state's scale.
    const double u = unit_roundoff(dt), factor = dt == DType::f64 ? 16.0 : 32.0;
    EXPECT_TRUE(matches_reference(s.master, expect_p, u, factor)) << dtype_name(dt) << " master";
    EXPECT_TRUE(matches_reference(s.m, expect_m, u, factor)) << dtype_name(dt) << " exp_avg";
    EXPECT_TRUE(matches_reference(s.v, expect_v, u, factor)) << dtype_name(dt) << " exp_avg_sq";
  }
}

TEST(AdamW, WeightDecayIsDecoupled) {
  // Zero gradient, zero moments: the Adam term is 0 / (0 + eps) = 0 and only p -= lr wd p remains.
  State s = make_state(kParams, DType::f32);
  Tensor grad = Tensor::zeros({4}, DType::f32), none;
  ops::adamw_step(s.master, s.m, s.v, grad, none, {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1.0f, 1});
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(float(s.master.item(i)), kParams[size_t(i)] * (1.0f - 0.05f)) << i;
}

TEST(AdamW, GradScaleEqualsScaledGradient) {
  State a = make_state(kParams, DType::f32), b = make_state(kParams, DType::f32);
  Tensor none;
  Tensor grad = Tensor::from_vector(kGrads[1], {4}), halved = Tensor::from_vector(kGrads[1], {4});
  for (int64_t i = 0; i < 4; ++i) halved.set_item(i, 0.5 * grad.item(i));  // exact
  ops::adamw_step(a.master, a.m, a.v, grad, none, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.5f, 1});
  ops::adamw_step(b.master, b.m, b.v, halved, none, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1});
  EXPECT_TRUE(all_close(a.master, b.master, 0.0, 0.0));
}

TEST(AdamW, WritesTheHalfModelCopyFromTheMaster) {
  State s = make_state(kParams, DType::f32), t = make_state(kParams, DType::f32);
  Tensor grad = Tensor::from_vector(kGrads[0], {4}), model = poisoned({2, 2}, DType::bf16);
  Tensor model16 = poisoned({2, 2}, DType::f16);
  ops::adamw_step(s.master, s.m, s.v, grad, model, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 1});
  ops::adamw_step(t.master, t.m, t.v, grad, model16, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 1});
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(model.data<bf16>()[i].bits, bf16(s.master.data<float>()[i]).bits) << i;
    EXPECT_EQ(model16.data<f16>()[i].bits, f16(t.master.data<float>()[i]).bits) << i;
  }
}

// Masters kept as remainders beside bf16 parameters: the joined master must take exactly the f32
// master's update, and the parameters its split, over steps whose masters have arbitrary low bits.
TEST(AdamW, RemainderMastersTakeTheF32MastersUpdateBitForBit) {
  const int64_t n = 4099;  // not a multiple of anything the backends vectorise by
  std::vector<float> masters(n), grads(n);
  for (int64_t i = 0; i < n; ++i) {
    masters[size_t(i)] = std::sin(0.731f * float(i)) * (i % 7 == 0 ? 1e-3f : 1.0f);
    grads[size_t(i)] = std::cos(0.113f * float(i)) * 0.5f;
  }
  State f32 = make_state(masters, DType::f32);
  Tensor f32_model = Tensor::empty({n}, DType::bf16);
  Tensor params = Tensor::empty({n}, DType::bf16), remainders = Tensor::empty({n}, DType::u16);
  for (int64_t i = 0; i < n; ++i) {
    const SplitMaster s = split_master(masters[size_t(i)]);
    params.data<bf16>()[i].bits = s.param;
    remainders.data<uint16_t>()[i] = s.remainder;
  }
  Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  const Tensor grad = Tensor::from_vector(grads, {n});
  int64_t ties = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    const AdamWParams p{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.75f, step};
    ops::adamw_step(f32.master, f32.m, f32.v, grad, f32_model, p);
    ops::adamw_step(remainders, m, v, grad, params, p);
    for (int64_t i = 0; i < n; ++i) {
      const float master = f32.master.data<float>()[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(master),
                join_master(params.data<bf16>()[i].bits, remainders.data<uint16_t>()[i]))
          << "element " << i << " step " << step;
      ASSERT_EQ(params.data<bf16>()[i].bits, split_master(master).param);
      if (params.data<bf16>()[i].bits != f32_model.data<bf16>()[i].bits) ++ties;
    }
    EXPECT_TRUE(all_close(m, f32.m, 0.0, 0.0));
    EXPECT_TRUE(all_close(v, f32.v, 0.0, 0.0));
  }
  // The bf16 copies differ only at exact ties, which 5 x 4099 updates should almost never hit.
  EXPECT_LE(ties, 2);
}

TEST(AdamW, RejectsBadArguments) {
  State s = make_state(kParams, DType::f32);
  Tensor grad = Tensor::from_vector(kGrads[0], {4}), none;
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(s.master, s.m, s.v, grad, none, {.step = 0}); }, "step"));
  Tensor short_grad = Tensor::zeros({3}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(s.master, s.m, s.v, short_grad, none, {}); }, "adamw grad"));
  Tensor bf16_grad = Tensor::zeros({4}, DType::bf16);
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(s.master, s.m, s.v, bf16_grad, none, {}); }, "adamw grad"));
  State half = make_state(kParams, DType::bf16);
  EXPECT_TRUE(
      throws_error_naming([&] { ops::adamw_step(half.master, half.m, half.v, bf16_grad, none, {}); }, "adamw master"));
  // Remainders complete bf16 parameters only.
  Tensor remainders = Tensor::zeros({4}, DType::u16), f32_params = Tensor::zeros({4}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(remainders, s.m, s.v, grad, none, {}); }, "remainders"));
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(remainders, s.m, s.v, grad, f32_params, {}); }, "remainders"));
  // FP8 codes are adamw_step_fp8's, alone or as a piece.
  Tensor codes = Tensor::zeros({4}, DType::e4m3);
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step(s.master, s.m, s.v, grad, codes, {}); }, "adamw_step_fp8"));
  std::vector<ops::AdamWPiece> fp8_piece{{0, grad, codes, 0.0f}};
  EXPECT_TRUE(
      throws_error_naming([&] { ops::adamw_step_pieces(s.master, s.m, s.v, fp8_piece, {}); }, "adamw_step_fp8"));
}

// Pieces of one flat state, each with its own gradient, compute copy and weight decay: every
// element follows torch's formula by hand with its piece's decay, the bf16 copy is its master
// rounded, and the elements between pieces keep their state.
TEST(AdamW, PiecesUpdateEachPieceWithItsOwnDecayAndLeaveTheGaps) {
  // Elements 0-1: piece A (decay 0.1); 2: a gap; 3-5: piece B (no decay).
  const std::vector<float> masters{1.0f, -0.5f, 7.0f, 0.25f, 2.0f, -3.0f};
  State s = make_state(masters, DType::f32);
  Tensor grad_a = Tensor::from_vector({0.5f, -1.0f}, {2}), grad_b = Tensor::from_vector({3.0f, 0.1f, -2.0f}, {3});
  Tensor copy_a = Tensor::zeros({2}, DType::bf16), copy_b = Tensor::zeros({3}, DType::bf16);
  std::vector<ops::AdamWPiece> pieces{{0, grad_a, copy_a, 0.1f}, {3, grad_b, copy_b, 0.0f}};
  const AdamWParams params{.lr = 0.01f, .weight_decay = 0.5f /* unused: each piece's own */, .step = 1};
  ops::adamw_step_pieces(s.master, s.m, s.v, pieces, params);
  const struct {
    int64_t element;
    const Tensor* grad;
    int64_t index;
    float decay;
    const Tensor* copy;
  } expected[] = {{0, &grad_a, 0, 0.1f, &copy_a},
                  {1, &grad_a, 1, 0.1f, &copy_a},
                  {3, &grad_b, 0, 0.0f, &copy_b},
                  {4, &grad_b, 1, 0.0f, &copy_b},
                  {5, &grad_b, 2, 0.0f, &copy_b}};
  for (const auto& e : expected) {
    HandAdam hand{masters[size_t(e.element)]};
    AdamWParams own = params;
    own.weight_decay = e.decay;
    hand.step(e.grad->item(e.index), own);
    EXPECT_NEAR(s.master.item(e.element), hand.p, 1e-6) << "element " << e.element;
    EXPECT_NEAR(s.m.item(e.element), hand.m, 1e-7) << "element " << e.element;
    EXPECT_EQ(e.copy->item(e.index), double(float(bf16(float(s.master.item(e.element)))))) << "element " << e.element;
  }
  EXPECT_EQ(s.master.item(2), 7.0);
  EXPECT_EQ(s.m.item(2), 0.0);
  EXPECT_EQ(s.v.item(2), 0.0);
  std::vector<ops::AdamWPiece> outside{{4, grad_b, copy_b, 0.0f}};
  EXPECT_TRUE(throws_error_naming([&] { ops::adamw_step_pieces(s.master, s.m, s.v, outside, params); },
                                  "lies outside the state's 6 elements"));
}
