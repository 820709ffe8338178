#pragma once
// Argument checks of the MoE routing family (ops/moe_routing.h), shared by both backends.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/moe_routing.h"

namespace megatron::ops::checks {

void check_moe_route(const Tensor& probs, const Tensor& topk_experts, const Tensor& sums, const Tensor& logits,
                     const Tensor& expert_bias, const TopKRouting& routing, TensorCheck device);
void check_moe_route_plan(const Tensor& row_token, const Tensor& row_prob, const Tensor& token_rows,
                          const Tensor& expert_offsets, const Tensor& topk_experts, const Tensor& probs,
                          TensorCheck device);
void check_moe_route_losses(const Tensor& values, const Tensor& sums, const TopKRouting& routing, TensorCheck device);
void check_moe_route_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& logits,
                              const Tensor& topk_experts, const Tensor& sums, const TopKRouting& routing,
                              TensorCheck device);

}  // namespace megatron::ops::checks
