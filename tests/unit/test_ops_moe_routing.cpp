// The CPU routing ops (ops/moe_routing.h) against the host routing (transformer/moe/routing.h) on
// the cases of unit/moe_routing_oracle.h. Tolerances: f64 1e-12 (the same formulas in the same
// order, the sums' order aside: a few dozen roundings of 2^-53); f32 1e-6 (each output rounded
// once to f32, 2^-24 ~ 6e-8 relative, from the same f32 inputs).
#include "unit/moe_routing_oracle.h"

using namespace megatron;
using namespace megatron::test;

TEST(OpsMoeRouting, CpuMatchesTheHostRouting) {
  uint64_t seed = 11;
  for (const RoutingCase& c : routing_cases()) {
    expect_ops_match_host_routing(c, Device::cpu(), DType::f64, 1e-12, seed);
    expect_ops_match_host_routing(c, Device::cpu(), DType::f32, 1e-6, seed);
    seed += 2;
  }
}

TEST(OpsMoeRouting, PlanOfNoTokensIsEmpty) {
  Tensor probs = Tensor::empty({0, 4}, DType::f32), topk = Tensor::empty({0, 2}, DType::i32);
  const moe::DispatchPlan plan = moe::plan_dispatch(probs, topk);
  EXPECT_EQ(plan.row_token.numel(), 0);
  EXPECT_EQ(plan.expert_rows.host_counts(), (std::vector<int64_t>{0, 0, 0, 0}));
}
