// The optimizer's side of loss scaling (optimizer.h): unscaling folded into AdamW reproduces the
// unscaled update exactly, and an overflow skips the step, leaving every piece of state as it was
// while the scaler backs off by Megatron's rules.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "megatron/optimizer/optimizer.h"

using namespace megatron;

namespace {

void add_params(ParameterRegistry& reg) {
  reg.add({.name = "w", .global_shape = {6, 5}});
  reg.add({.name = "b", .global_shape = {5}, .weight_decay = false});
  reg.allocate(DType::f16);
  reg.initialize(7);
}

// Gradients of step `step`, times `scale`: multiples of 1/8 in [-2, 2], so the scaled values
// (scale a power of two) are exact in fp32.
void fill_grads(ParameterRegistry& reg, int step, float scale) {
  int64_t k = 0;
  for (const auto& p : reg.params())
    for (int64_t i = 0; i < p->main_grad.numel(); ++i, ++k)
      p->main_grad.set_item(i, scale * float((k * 7 + step * 13) % 33 - 16) / 8.0f);
}

// Everything a step may change: parameters and the optimizer state (moments, fp32 master).
std::vector<float> snapshot(ParameterRegistry& reg, const Optimizer& opt) {
  std::vector<float> all = reg.param_buffer().to_vector();
  for (const auto& s : opt.sharded_state(Optimizer::StateCopies::one_replica)) {
    const std::vector<float> v = s.local.to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

DynamicGradScalerParams small_scaler() {
  return {.initial_scale = 1024.0f, .min_scale = 1.0f, .growth_interval = 1000, .hysteresis = 2};
}

}  // namespace

// A power-of-two scale is exact in the gradients, in the norm (S^2 scales every square, and sqrt
// of a power of four is exact) and in the folded factor clip * (1/S), so the scaled optimizer must
// match the unscaled one bit for bit, with clipping active (the norm of these grads exceeds 1).
TEST(LossScaling, FoldedUnscalingUpdatesExactlyLikeUnscaledGradients) {
  const ParallelContext ctx = ParallelContext::single_process();
  ParameterRegistry plain_reg, scaled_reg;
  add_params(plain_reg);
  add_params(scaled_reg);
  AdamWOptimizer plain(plain_reg, ctx, {.clip_grad = 1.0});
  AdamWOptimizer scaled(scaled_reg, ctx, {.clip_grad = 1.0}, std::make_unique<DynamicGradScaler>(small_scaler()));
  for (int step = 0; step < 3; ++step) {
    fill_grads(plain_reg, step, 1.0f);
    fill_grads(scaled_reg, step, scaled.loss_scale());
    const OptimizerStepResult a = plain.step({1e-2, 0.1}), b = scaled.step({1e-2, 0.1});
    ASSERT_FALSE(b.skipped);
    ASSERT_TRUE(a.grad_norm && b.grad_norm);
    EXPECT_GT(*a.grad_norm, 1.0);
    EXPECT_EQ(*a.grad_norm, *b.grad_norm) << "step " << step;
    EXPECT_EQ(snapshot(plain_reg, plain), snapshot(scaled_reg, scaled)) << "step " << step;
  }
  EXPECT_EQ(scaled.step_count(), 3);
  EXPECT_EQ(scaled.grad_scaler()->state(), (GradScalerState{1024.0f, 3, 2}));
}

// Megatron's skip: no parameter, moment or step-count change, no grad norm; the scaler absorbs the
// first overflow (hysteresis 2 -> 1) and halves on the second. A NaN counts like an inf.
TEST(LossScaling, OverflowSkipsTheStepAndBacksOffTheScale) {
  const ParallelContext ctx = ParallelContext::single_process();
  ParameterRegistry reg;
  add_params(reg);
  AdamWOptimizer opt(reg, ctx, {.clip_grad = 1.0}, std::make_unique<DynamicGradScaler>(small_scaler()));
  fill_grads(reg, 0, opt.loss_scale());
  ASSERT_FALSE(opt.step({1e-2, 0.1}).skipped);  // some moments, so that "unchanged" means something

  const std::vector<GradScalerState> after = {{1024.0f, 0, 1}, {512.0f, 0, 0}, {256.0f, 0, -1}};
  const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  for (size_t k = 0; k < after.size(); ++k) {
    fill_grads(reg, 1, opt.loss_scale());
    reg.params()[k % 2]->main_grad.set_item(3, bad[k]);
    const std::vector<float> before = snapshot(reg, opt);
    const OptimizerStepResult r = opt.step({1e-2, 0.1});
    EXPECT_TRUE(r.skipped) << "overflow " << k;
    EXPECT_FALSE(r.grad_norm.has_value());
    EXPECT_EQ(opt.step_count(), 1);
    EXPECT_EQ(opt.grad_scaler()->state(), after[k]) << "overflow " << k;
    EXPECT_EQ(snapshot(reg, opt), before) << "overflow " << k;
  }
  fill_grads(reg, 2, opt.loss_scale());
  EXPECT_FALSE(opt.step({1e-2, 0.1}).skipped);
  EXPECT_EQ(opt.step_count(), 2);
}

// Megatron's static scale: the same check and skip, but the scale never moves.
TEST(LossScaling, StaticScaleSkipsOverflowsWithoutChanging) {
  const ParallelContext ctx = ParallelContext::single_process();
  ParameterRegistry reg;
  add_params(reg);
  AdamWOptimizer opt(reg, ctx, {}, std::make_unique<ConstantGradScaler>(64.0f));
  fill_grads(reg, 0, 64.0f);
  reg.params()[0]->main_grad.set_item(0, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(opt.step({1e-2, 0.0}).skipped);
  EXPECT_EQ(opt.loss_scale(), 64.0f);
  EXPECT_EQ(opt.step_count(), 0);
}
