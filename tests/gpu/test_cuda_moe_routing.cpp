// The CUDA routing ops (ops/moe_routing.h) against the host routing (transformer/moe/routing.h) on
// the cases of unit/moe_routing_oracle.h, as the CPU ops are (unit/test_ops_moe_routing.cpp).
// Tolerances: f64 1e-12 (the CPU's formulas in double; CUDA's exp and log err by up to 2 ulp
// where the host's are correctly rounded, and the sums reduce in a tree: a few dozen roundings of
// 2^-53); f32 1e-6 (each output rounded once to f32, 2^-24 ~ 6e-8 relative).
#include "gpu/cuda_test_util.h"
#include "unit/moe_routing_oracle.h"

using namespace megatron;
using namespace megatron::test;

namespace {
class CudaMoeRouting : public CudaTest {};
}  // namespace

TEST_F(CudaMoeRouting, MatchesTheHostRouting) {
  uint64_t seed = 11;
  for (const RoutingCase& c : routing_cases()) {
    expect_ops_match_host_routing(c, gpu(), DType::f64, 1e-12, seed);
    expect_ops_match_host_routing(c, gpu(), DType::f32, 1e-6, seed);
    seed += 2;
  }
}
