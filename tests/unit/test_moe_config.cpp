// MoE settings: --moe-layer-freq in both of Megatron's forms, and bad combinations reported with
// the value, the rule and the fix before any work starts.
#include <gtest/gtest.h>

#include "megatron/transformer/moe/moe_config.h"

using namespace megatron;

namespace {

MoEConfig eight_experts() {
  MoEConfig m;
  m.num_moe_experts = 8;
  m.moe_ffn_hidden_size = 64;
  return m;
}

// The one message validate_moe gives, which must contain `needle`.
void expect_error(const MoEConfig& m, const std::string& needle, bool add_bias_linear = false) {
  const std::vector<std::string> errors = validate_moe(m, 4, add_bias_linear);
  ASSERT_EQ(errors.size(), 1u) << (errors.empty() ? "no error" : errors.front());
  EXPECT_NE(errors.front().find(needle), std::string::npos) << errors.front();
}

}  // namespace

TEST(MoEConfig, LayerFrequencyAsEveryNthOrAList) {
  std::string why;
  EXPECT_EQ(moe_layer_pattern("1", 3, &why), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(moe_layer_pattern("2", 4, &why), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(moe_layer_pattern("[0, 1,1 ,0]", 4, &why), (std::vector<bool>{false, true, true, false}));
  EXPECT_TRUE(moe_layer_pattern("[1,0]", 4, &why).empty());
  EXPECT_NE(why.find("2 entries for 4 layers"), std::string::npos) << why;
  EXPECT_TRUE(moe_layer_pattern("0", 4, &why).empty());
  EXPECT_TRUE(moe_layer_pattern("[1,2,0,0]", 4, &why).empty());
}

TEST(MoEConfig, ValidSettingsAndDenseModelsPass) {
  EXPECT_TRUE(validate_moe(eight_experts(), 4, false).empty());
  EXPECT_TRUE(validate_moe(MoEConfig{}, 4, true).empty());  // dense: nothing to check
}

TEST(MoEConfig, BadCombinationsAreNamed) {
  MoEConfig m = eight_experts();
  m.moe_router_topk = 9;
  expect_error(m, "--moe-router-topk 9 must lie in [1, --num-experts 8]");
  m = eight_experts();
  m.moe_router_num_groups = 3;
  m.moe_router_group_topk = 1;
  expect_error(m, "--moe-router-num-groups 3 does not divide --num-experts 8");
  m = eight_experts();
  m.moe_router_num_groups = 4;
  expect_error(m, "go together");
  m = eight_experts();
  m.moe_router_enable_expert_bias = true;
  expect_error(m, "needs --moe-router-score-function sigmoid");
  m = eight_experts();
  m.moe_pad_expert_input_to_capacity = true;
  expect_error(m, "needs --moe-expert-capacity-factor");
  m = eight_experts();
  m.moe_expert_capacity_factor = 0.0;
  expect_error(m, "--moe-expert-capacity-factor 0 must be positive");
  m = eight_experts();
  m.moe_layer_freq = "[1,0]";
  expect_error(m, "--moe-layer-freq '[1,0]' cannot be used");
  expect_error(eight_experts(), "add --disable-bias-linear", true);
}
