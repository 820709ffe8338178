#pragma once
// The routing ops (ops/moe_routing.h) against the host routing (transformer/moe/routing.h, in f64:
// the reference) on hand-sized cases, shared by the CPU op's test (unit/test_ops_moe_routing.cpp)
// and the CUDA one (gpu/test_cuda_moe_routing.cpp). Per case: the choice (as a set per token) and
// the loads exactly; the probabilities, the losses and the logits' gradient within `tol`
// (relative, the gradient's relative to its largest element); the permutation exactly against the
// host plan (token_dispatcher.h). Logits are bf16-exact N(0,1) draws, so equal logits occur in a
// token: the ties go to the lower expert index on both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "megatron/ops/moe_routing.h"
#include "megatron/transformer/moe/routing.h"
#include "megatron/transformer/moe/token_dispatcher.h"
#include "unit/op_test_util.h"

namespace megatron::test {

struct RoutingCase {
  std::string name;
  int64_t S, B, E;  // tokens (S,B) sequence-major
  moe::RoutingParams params;
  bool expert_bias;
};

inline std::vector<RoutingCase> routing_cases() {
  return {
      {"softmax_top2_aux_z", 6, 4, 8,
       {.topk = 2, .load_balancing = LoadBalancingType::aux_loss, .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001,
        .sequence_length = 6},
       false},
      {"pre_softmax_top3_scaled_seq_aux", 6, 4, 8,
       {.topk = 3,
        .pre_softmax = true,
        .scaling_factor = 1.5,
        .load_balancing = LoadBalancingType::seq_aux_loss,
        .aux_loss_coeff = 0.02,
        .sequence_length = 6},
       false},
      {"sigmoid_groups_bias_seq_aux_z", 6, 4, 16,
       {.topk = 4,
        .score_function = RouterScoreFunction::sigmoid,
        .num_groups = 4,
        .group_topk = 2,
        .scaling_factor = 2.5,
        .load_balancing = LoadBalancingType::seq_aux_loss,
        .aux_loss_coeff = 0.01,
        .z_loss_coeff = 0.001,
        .sequence_length = 6},
       true},
      {"sigmoid_top1_z", 6, 4, 4,
       {.topk = 1,
        .score_function = RouterScoreFunction::sigmoid,
        .load_balancing = LoadBalancingType::none,
        .z_loss_coeff = 0.01,
        .sequence_length = 6},
       false},
      {"softmax_groups_no_losses", 6, 4, 6,
       {.topk = 2, .num_groups = 2, .group_topk = 1, .load_balancing = LoadBalancingType::none, .sequence_length = 6},
       false},
      // More tokens than one block of the CUDA plan's scan (256) and of its token kernels (128).
      {"softmax_top2_many_tokens", 128, 3, 8,
       {.topk = 2, .load_balancing = LoadBalancingType::aux_loss, .aux_loss_coeff = 0.01, .sequence_length = 128},
       false},
  };
}

inline std::vector<double> doubles_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) v[size_t(i)] = host.item(i);
  return v;
}

inline Tensor tensor_of(const std::vector<double>& v, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) t.set_item(int64_t(i), v[i]);
  return t;
}

inline void expect_ops_match_host_routing(const RoutingCase& c, Device device, DType dtype, double tol, uint64_t seed) {
  SCOPED_TRACE(c.name + " " + dtype_name(dtype));
  const int64_t T = c.S * c.B, E = c.E, k = c.params.topk;
  const Tensor logits = randn({T, E}, dtype, seed);
  std::vector<double> bias;
  if (c.expert_bias)
    for (int64_t e = 0; e < E; ++e) bias.push_back(0.125 * double(e % 3) - 0.125);  // exact in every dtype
  const std::vector<double> host_logits = doubles_of(logits);
  const moe::Routing r = moe::route(host_logits, T, E, c.params, bias);

  // Forward.
  const ops::TopKRouting tr = moe::topk_routing(c.params, T);
  const Tensor dev_logits = logits.to(device);
  const Tensor dev_bias = c.expert_bias ? tensor_of(bias, {E}, dtype).to(device) : Tensor();
  Tensor probs = Tensor::empty({T, E}, dtype, device), topk = Tensor::empty({T, k}, DType::i32, device);
  Tensor sums = Tensor::empty({ops::routing_sums_size(E, tr)}, DType::f64, device);
  ops::moe_route(probs, topk, sums, dev_logits, dev_bias, tr);
  Tensor stats = Tensor::empty({2 + E}, dtype, device);
  ops::moe_route_losses(stats, sums, tr);

  const std::vector<double> chosen = doubles_of(topk);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<uint8_t> mine(static_cast<size_t>(E), 0);
    for (int64_t j = 0; j < k; ++j) mine[size_t(chosen[size_t(t * k + j)])] = 1;
    EXPECT_EQ(mine, std::vector<uint8_t>(r.chosen.begin() + t * E, r.chosen.begin() + (t + 1) * E)) << "token " << t;
  }
  EXPECT_TRUE(all_close(probs.to(Device::cpu()), tensor_of(r.probs, {T, E}, DType::f64), tol, tol));
  const std::vector<double> values = doubles_of(stats);
  EXPECT_NEAR(values[0], r.load_balancing_loss, tol * std::max(1.0, std::fabs(r.load_balancing_loss)));
  EXPECT_NEAR(values[1], r.z_loss, tol * std::max(1.0, std::fabs(r.z_loss)));
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(values[size_t(2 + e)], double(r.all_tokens_per_expert[size_t(e)]));

  // The permutation.
  const moe::DispatchPlan host_plan = moe::plan_dispatch(r, 0, E, Device::cpu(), dtype);
  const moe::DispatchPlan plan = moe::plan_dispatch(probs, topk);
  EXPECT_EQ(doubles_of(plan.row_token), doubles_of(host_plan.row_token));
  EXPECT_EQ(doubles_of(plan.token_rows), doubles_of(host_plan.token_rows));
  EXPECT_TRUE(all_close(plan.row_prob.to(Device::cpu()), host_plan.row_prob, tol, tol));
  std::vector<double> offsets{0.0};
  for (int64_t n : r.tokens_per_expert) offsets.push_back(offsets.back() + double(n));
  EXPECT_EQ(doubles_of(plan.expert_rows.offsets), offsets);
  EXPECT_EQ(plan.expert_rows.host_counts(), r.tokens_per_expert);

  // Backward, with the losses' gradients scaled as MoELayer's backward scales them.
  const double aux_scale = 0.5;
  const Tensor dprobs = randn({T, E}, dtype, seed + 1);
  const std::vector<double> expected = moe::route_backward(doubles_of(dprobs), host_logits, r, c.params, aux_scale);
  const bool aux = c.params.load_balancing != LoadBalancingType::none && c.params.aux_loss_coeff > 0.0;
  Tensor dlogits = Tensor::empty({T, E}, dtype, device);
  ops::moe_route_backward(dlogits, dprobs.to(device), dev_logits, topk, sums, tr,
                          aux ? aux_scale * c.params.aux_loss_coeff : 0.0, aux_scale * c.params.z_loss_coeff);
  double largest = 0.0;
  for (double v : expected) largest = std::max(largest, std::fabs(v));
  EXPECT_TRUE(all_close(dlogits.to(Device::cpu()), tensor_of(expected, {T, E}, DType::f64), tol, tol * largest));
}

}  // namespace megatron::test
