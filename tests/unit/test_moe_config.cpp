// MoE settings: --moe-layer-freq in each of Megatron's forms, and bad combinations reported with
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

// Megatron evaluates a pattern with '[' as Python: lists joined by + and repeated by * (a count on
// either side), in parentheses or not, as DeepSeek-V3's ([0]*3+[1]*58) and Qwen3-MoE's ([1]*48).
// Known answers written out by hand; what Python would refuse or read otherwise is an error naming
// the place.
TEST(MoEConfig, LayerFrequencyAsMegatronsListExpression) {
  std::string why;
  const auto pattern = [&](const std::string& freq, int64_t layers) {
    why.clear();
    return moe_layer_pattern(freq, layers, &why);
  };
  using P = std::vector<bool>;
  EXPECT_EQ(pattern("([0]*3+[1]*2)", 5), (P{false, false, false, true, true}));
  EXPECT_EQ(pattern("[1]*3", 3), (P{true, true, true}));
  EXPECT_EQ(pattern("([1]*3+[0]*1)*2", 8), (P{true, true, true, false, true, true, true, false}));
  EXPECT_EQ(pattern("2 * [1, 0] + [0]", 5), (P{true, false, true, false, false}));
  EXPECT_EQ(pattern("[0]+[1]*2*2", 5), (P{false, true, true, true, true}));
  EXPECT_EQ(pattern("[1,0,]*2", 4), (P{true, false, true, false}));
  EXPECT_EQ(pattern("[]+[1]*2", 2), (P{true, true}));
  EXPECT_EQ(pattern("[0]*0*7+[1]", 1), (P{true}));  // a count of 0 repeats nothing, as in Python
  EXPECT_TRUE(why.empty()) << why;
  const auto error = [&](const std::string& freq, int64_t layers) {
    EXPECT_TRUE(pattern(freq, layers).empty()) << freq;
    return why;
  };
  EXPECT_NE(error("([0]*3+[1]*2)", 4).find("5 entries for 4 layers"), std::string::npos) << why;
  EXPECT_NE(error("([1]*3", 3).find("a '(' without its ')' at character 7"), std::string::npos) << why;
  EXPECT_NE(error("[1]*[1]", 2).find("a list multiplied by a list"), std::string::npos) << why;
  EXPECT_NE(error("[1]+2", 3).find("a count with no list to repeat"), std::string::npos) << why;
  EXPECT_NE(error("[1,2]*2", 4).find("list entry 2, not 0 or 1"), std::string::npos) << why;
  EXPECT_NE(error("[1 0]", 2).find("a list without its ']'"), std::string::npos) << why;
  EXPECT_NE(error("[1]*3)", 3).find("unexpected ')' at character 6"), std::string::npos) << why;
  EXPECT_NE(error("[1]*99999999999", 3).find("a count above"), std::string::npos) << why;
  EXPECT_NE(error("[1]*1048576*99999999999999", 3).find("a count above"), std::string::npos) << why;
  EXPECT_NE(error("[x]", 1).find("not 0 or 1"), std::string::npos) << why;
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
  m.moe_shared_expert_gate = true;
  expect_error(m, "--moe-shared-expert-gate gates the shared expert, and there is none");
  m = eight_experts();
  m.moe_expert_capacity_factor = 0.0;
  expect_error(m, "--moe-expert-capacity-factor 0 must be positive");
  m = eight_experts();
  m.moe_layer_freq = "[1,0]";
  expect_error(m, "--moe-layer-freq '[1,0]' cannot be used");
  expect_error(eight_experts(), "add --disable-bias-linear", true);
}
