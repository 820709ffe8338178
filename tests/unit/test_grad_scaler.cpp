#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "megatron/optimizer/grad_scaler.h"
#include "op_test_util.h"

using namespace megatron;
using megatron::test::throws_error_naming;

namespace {

struct Expected {
  bool found_inf;
  GradScalerState after;  // scale, growth tracker, hysteresis tracker after update(found_inf)
};

// initial 1024, min 64, window 3, hysteresis 2. Each row applies Megatron's rules (grad_scaler.h)
// to the row before it, starting from (scale 1024, growth 0, hysteresis 2):
const DynamicGradScalerParams kParams{1024.0f, 64.0f, 2.0f, 0.5f, 3, 2};
const std::vector<Expected> kScript = {
    {false, {1024, 1, 2}},  //  1 clean: growth 0 -> 1
    {true, {1024, 0, 1}},   //  2 inf: growth reset, hysteresis 2 -> 1 > 0, so the scale stays
    {false, {1024, 1, 1}},  //  3 clean: growth 1; a clean step leaves hysteresis at 1
    {true, {512, 0, 0}},    //  4 inf: hysteresis 1 -> 0 <= 0: scale max(1024 * 0.5, 64) = 512
    {false, {512, 1, 0}},   //  5 clean
    {false, {512, 2, 0}},   //  6 clean: growth 2, one short of the window
    {true, {256, 0, -1}},   //  7 inf: hysteresis 0 -> -1 <= 0: backs off at once, 512 -> 256
    {false, {256, 1, -1}},  //  8 clean
    {false, {256, 2, -1}},  //  9 clean
    {false, {512, 0, 2}},   // 10 clean: growth reaches 3: reset, hysteresis refilled to 2, 256 * 2
    {true, {512, 0, 1}},    // 11 inf: the refilled hysteresis absorbs one overflow again
    {true, {256, 0, 0}},    // 12 inf: 512 -> 256
    {true, {128, 0, -1}},   // 13 inf: 256 -> 128
    {true, {64, 0, -2}},    // 14 inf: 128 -> 64 = min
    {true, {64, 0, -3}},    // 15 inf: max(32, 64) = 64: the floor holds
    {false, {64, 1, -3}},   // 16 clean
    {false, {64, 2, -3}},   // 17 clean
    {false, {128, 0, 2}},   // 18 clean: window reached, 64 * 2
};

std::string describe(const GradScalerState& s) {
  return "(scale " + std::to_string(s.scale) + ", growth " + std::to_string(s.growth_tracker) + ", hysteresis " +
         std::to_string(s.hysteresis_tracker) + ")";
}

}  // namespace

TEST(DynamicGradScaler, ScriptedSequenceFollowsMegatronRules) {
  DynamicGradScaler scaler(kParams);
  EXPECT_EQ(scaler.state(), (GradScalerState{1024, 0, 2}));
  for (size_t i = 0; i < kScript.size(); ++i) {
    scaler.update(kScript[i].found_inf);
    ASSERT_EQ(scaler.state(), kScript[i].after) << "after update " << i + 1 << ": got " << describe(scaler.state());
    EXPECT_EQ(scaler.scale(), kScript[i].after.scale);
  }
  EXPECT_EQ(scaler.inv_scale(), 1.0f / 128.0f);
}

TEST(DynamicGradScaler, DefaultsGrowAfterExactlyOneWindowOfCleanSteps) {
  DynamicGradScaler scaler(DynamicGradScalerParams{});
  EXPECT_EQ(scaler.scale(), 4294967296.0f);  // 2^32
  for (int i = 0; i < 999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.state(), (GradScalerState{4294967296.0f, 999, 2}));
  scaler.update(false);  // the 1000th clean step
  EXPECT_EQ(scaler.state(), (GradScalerState{8589934592.0f, 0, 2}));
  scaler.update(true);  // hysteresis 2: the first overflow only counts
  EXPECT_EQ(scaler.scale(), 8589934592.0f);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4294967296.0f);
}

TEST(DynamicGradScaler, ResumedFromJsonStateContinuesIdentically) {
  DynamicGradScaler uninterrupted(kParams), first(kParams);
  const size_t cut = 7;  // mid-sequence: hysteresis tracker negative, growth tracker 0
  for (size_t i = 0; i < cut; ++i) first.update(kScript[i].found_inf);
  const nlohmann::json saved = first.state();
  EXPECT_EQ(saved, nlohmann::json::parse(R"({"scale": 256.0, "growth_tracker": 0, "hysteresis_tracker": -1})"));
  DynamicGradScaler resumed(kParams);
  resumed.load_state(nlohmann::json::parse(saved.dump()).get<GradScalerState>());
  for (size_t i = 0; i < kScript.size(); ++i) {
    uninterrupted.update(kScript[i].found_inf);
    if (i >= cut) {
      resumed.update(kScript[i].found_inf);
      ASSERT_EQ(resumed.state(), uninterrupted.state()) << "update " << i + 1;
    }
  }
}

TEST(DynamicGradScaler, GrowthTrackerFromALongerWindowGrowsOnTheNextCleanStep) {
  DynamicGradScaler scaler(kParams);  // window 3
  scaler.load_state({512, 5, 1});     // saved under a window of more than 5
  scaler.update(false);
  EXPECT_EQ(scaler.state(), (GradScalerState{1024, 0, 2}));
}

TEST(DynamicGradScaler, RejectsBadParamsAndState) {
  const auto with = [](auto change) {
    DynamicGradScalerParams p;
    change(p);
    return p;
  };
  EXPECT_TRUE(
      throws_error_naming([&] { DynamicGradScaler s(with([](auto& p) { p.min_scale = 0.0f; })); }, "--min-loss-scale"));
  EXPECT_TRUE(throws_error_naming(
      [&] { DynamicGradScaler s(with([](auto& p) { p.min_scale = 2.0f * p.initial_scale; })); }, "exceeds"));
  EXPECT_TRUE(throws_error_naming([&] { DynamicGradScaler s(with([](auto& p) { p.growth_interval = 0; })); },
                                  "--loss-scale-window"));
  EXPECT_TRUE(
      throws_error_naming([&] { DynamicGradScaler s(with([](auto& p) { p.hysteresis = 0; })); }, "--hysteresis"));
  EXPECT_TRUE(
      throws_error_naming([&] { DynamicGradScaler s(with([](auto& p) { p.backoff_factor = 1.0f; })); }, "backoff"));
  DynamicGradScaler scaler(kParams);
  EXPECT_TRUE(throws_error_naming([&] { scaler.load_state({0.0f, 0, 2}); }, "scale"));
  EXPECT_TRUE(throws_error_naming([&] { scaler.load_state({8.0f, -1, 2}); }, "growth_tracker"));
  EXPECT_TRUE(throws_error_naming(
      [&] { (void)nlohmann::json::parse(R"({"scale": 8.0, "growth_tracker": 0})").get<GradScalerState>(); },
      "hysteresis_tracker"));
}

TEST(ConstantGradScaler, NeverChanges) {
  ConstantGradScaler scaler(65536.0f);
  for (bool inf : {true, true, true, false}) scaler.update(inf);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_EQ(scaler.inv_scale(), 1.0f / 65536.0f);
  scaler.load_state({8.0f, 3, -1});  // the flag's value wins over a checkpoint's, as in Megatron
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_TRUE(throws_error_naming([] { ConstantGradScaler bad(-1.0f); }, "static loss scale"));
}

TEST(GradScaler, MegatronChoosesTheScalerFromDtypeAndStaticScale) {
  const DynamicGradScalerParams dynamic;
  EXPECT_NE(dynamic_cast<DynamicGradScaler*>(make_grad_scaler(DType::f16, 0.0f, dynamic).get()), nullptr);
  EXPECT_NE(dynamic_cast<ConstantGradScaler*>(make_grad_scaler(DType::f16, 128.0f, dynamic).get()), nullptr);
  EXPECT_NE(dynamic_cast<ConstantGradScaler*>(make_grad_scaler(DType::bf16, 128.0f, dynamic).get()), nullptr);
  EXPECT_EQ(make_grad_scaler(DType::bf16, 0.0f, dynamic), nullptr);
  EXPECT_EQ(make_grad_scaler(DType::f32, 128.0f, dynamic), nullptr);
  EXPECT_TRUE(throws_error_naming([&] { make_grad_scaler(DType::f16, -4.0f, dynamic); }, "static loss scale"));
}
