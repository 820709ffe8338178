#include "megatron/ops/checks/moe_routing.h"

namespace megatron::ops::checks {
namespace {

void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* name, TensorCheck device) {
  check_defined(t, name);
  device(t, name);
  check_dtype(t, dtype, name);
  check_shape(t, shape, name);
}

// logits (T,E) f32|f64 and the routing's limits for E experts.
void check_logits(const Tensor& logits, const TopKRouting& r, const char* op, TensorCheck device) {
  check_defined(logits, op);
  device(logits, op);
  MEGATRON_CHECK(logits.ndim() == 2, op << ": logits must be (T,E), got " << shape_str(logits.shape()));
  MEGATRON_CHECK(logits.dtype() == DType::f32 || logits.dtype() == DType::f64,
                 op << ": logits must be f32 or f64 (the router runs in fp32), got " << dtype_name(logits.dtype()));
  const int64_t E = logits.dim(1);
  MEGATRON_CHECK(r.topk >= 1 && r.topk <= E && r.topk <= kMaxRoutingTopk,
                 op << ": top-k " << r.topk << " must be in [1, min(experts " << E << ", " << kMaxRoutingTopk << ")]");
  if (r.num_groups > 0) {
    MEGATRON_CHECK(r.num_groups <= kMaxRoutingGroups && E % r.num_groups == 0,
                   op << ": " << r.num_groups << " expert groups must divide the " << E << " experts and be at most "
                      << kMaxRoutingGroups);
    MEGATRON_CHECK(r.group_topk >= 1 && r.group_topk <= r.num_groups && r.topk % r.group_topk == 0,
                   op << ": group top-k " << r.group_topk << " must be in [1, " << r.num_groups << "] and divide top-k "
                      << r.topk);
  }
  MEGATRON_CHECK(r.balancing_sequences == 0 || logits.dim(0) % r.balancing_sequences == 0,
                 op << ": " << logits.dim(0) << " tokens are not whole (S," << r.balancing_sequences << ") sequences");
}

}  // namespace

void check_moe_route(const Tensor& probs, const Tensor& topk_experts, const Tensor& sums, const Tensor& logits,
                     const Tensor& expert_bias, const TopKRouting& r, TensorCheck device) {
  check_logits(logits, r, "moe_route", device);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_tensor(probs, {T, E}, logits.dtype(), "moe_route probs", device);
  check_tensor(topk_experts, {T, r.topk}, DType::i32, "moe_route topk_experts", device);
  check_tensor(sums, {routing_sums_size(E, r)}, DType::f64, "moe_route sums", device);
  if (expert_bias.defined()) check_tensor(expert_bias, {E}, logits.dtype(), "moe_route expert_bias", device);
}

void check_moe_route_plan(const Tensor& row_token, const Tensor& row_prob, const Tensor& token_rows,
                          const Tensor& expert_offsets, const Tensor& topk_experts, const Tensor& probs,
                          TensorCheck device) {
  check_defined(probs, "moe_route_plan probs");
  MEGATRON_CHECK(probs.ndim() == 2, "moe_route_plan: probs must be (T,E), got " << shape_str(probs.shape()));
  const int64_t T = probs.dim(0), E = probs.dim(1);
  check_defined(topk_experts, "moe_route_plan topk_experts");
  MEGATRON_CHECK(topk_experts.ndim() == 2 && topk_experts.dim(0) == T,
                 "moe_route_plan: topk_experts must be (T,k) with T = " << T << ", got "
                                                                          << shape_str(topk_experts.shape()));
  const int64_t N = T * topk_experts.dim(1);
  MEGATRON_CHECK(N < (int64_t(1) << 31), "moe_route_plan: " << N << " rows do not fit the i32 row indices");
  check_tensor(topk_experts, topk_experts.shape(), DType::i32, "moe_route_plan topk_experts", device);
  check_tensor(probs, probs.shape(), probs.dtype(), "moe_route_plan probs", device);
  check_tensor(row_token, {N}, DType::i32, "moe_route_plan row_token", device);
  check_tensor(row_prob, {N}, probs.dtype(), "moe_route_plan row_prob", device);
  check_tensor(token_rows, {T, E}, DType::i32, "moe_route_plan token_rows", device);
  check_tensor(expert_offsets, {E + 1}, DType::i32, "moe_route_plan expert_offsets", device);
}

void check_moe_route_losses(const Tensor& values, const Tensor& sums, const TopKRouting& r, TensorCheck device) {
  check_defined(values, "moe_route_losses values");
  const int64_t E = values.numel() - 2;
  MEGATRON_CHECK(E >= 1, "moe_route_losses: values must hold 2 + E values, got " << values.numel());
  check_tensor(values, values.shape(), values.dtype(), "moe_route_losses values", device);
  MEGATRON_CHECK(values.dtype() == DType::f32 || values.dtype() == DType::f64,
                 "moe_route_losses: values must be f32 or f64, got " << dtype_name(values.dtype()));
  check_tensor(sums, {routing_sums_size(E, r)}, DType::f64, "moe_route_losses sums", device);
}

void check_moe_route_backward(const Tensor& dlogits, const Tensor& dprobs, const Tensor& logits,
                              const Tensor& topk_experts, const Tensor& sums, const TopKRouting& r,
                              TensorCheck device) {
  check_logits(logits, r, "moe_route_backward", device);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_tensor(dlogits, {T, E}, logits.dtype(), "moe_route_backward dlogits", device);
  check_tensor(dprobs, {T, E}, logits.dtype(), "moe_route_backward dprobs", device);
  check_tensor(topk_experts, {T, r.topk}, DType::i32, "moe_route_backward topk_experts", device);
  check_tensor(sums, {routing_sums_size(E, r)}, DType::f64, "moe_route_backward sums", device);
}

}  // namespace megatron::ops::checks
