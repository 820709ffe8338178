// MoE routing on the CPU: each token's arithmetic of moe_routing_token.h, then the sums in token
// order; the plan by one pass over the tokens in order.
#include "megatron/ops/moe_routing.h"

#include <vector>

#include "megatron/ops/checks/moe_routing.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/moe_routing_token.h"

namespace megatron::ops::cpu {
namespace {

namespace detail = moe_routing_detail;

template <class T>
void route(T* probs, int32_t* topk, double* sums, const T* logits, const T* bias, int64_t T_, int64_t E,
           const TopKRouting& p) {
  const int64_t B = p.balancing_sequences, C = detail::contribution_size(E), S = routing_sums_size(E, p);
  std::vector<double> contribution(static_cast<size_t>(T_ * C));
  for (int64_t t = 0; t < T_; ++t)
    detail::route_token(logits + t * E, bias, E, p, probs + t * E, topk + t * p.topk, contribution.data() + t * C);
  for (int64_t j = 0; j < S; ++j) {
    const detail::SumSource src = detail::sum_source(j, E, B);
    double sum = 0.0;
    for (int64_t t = src.sequence < 0 ? 0 : src.sequence; t < T_; t += src.sequence < 0 ? 1 : B)
      sum += contribution[size_t(t * C + src.column)];
    sums[j] = sum;
  }
}

template <class T>
void plan(int32_t* row_token, T* row_prob, int32_t* token_rows, int32_t* offsets, const int32_t* topk,
          const T* probs, int64_t T_, int64_t E, int64_t k) {
  std::vector<int32_t> next(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < T_ * k; ++i) ++next[size_t(topk[i])];
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + next[size_t(e)];
  for (int64_t e = 0; e < E; ++e) next[size_t(e)] = offsets[e];
  for (int64_t i = 0; i < T_ * E; ++i) token_rows[i] = -1;
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk[t * k + j], row = next[size_t(e)]++;
      row_token[row] = int32_t(t);
      row_prob[row] = probs[t * E + e];
      token_rows[t * E + e] = row;
    }
  }
}

}  // namespace
}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::moe_route(Tensor& probs, Tensor& topk_experts, Tensor& sums, const Tensor& logits, const Tensor& expert_bias,
                    const TopKRouting& routing) {
  checks::check_moe_route(probs, topk_experts, sums, logits, expert_bias, routing, check_cpu);
  detail::dispatch_router(logits.dtype(), [&]<class T>(std::type_identity<T>) {
    route<T>(probs.data<T>(), topk_experts.data<int32_t>(), sums.data<double>(), logits.data<T>(),
             expert_bias.defined() ? expert_bias.data<T>() : nullptr, logits.dim(0), logits.dim(1), routing);
  });
}

void cpu::moe_route_plan(Tensor& row_token, Tensor& row_prob, Tensor& token_rows, Tensor& expert_offsets,
                         const Tensor& topk_experts, const Tensor& probs) {
  checks::check_moe_route_plan(row_token, row_prob, token_rows, expert_offsets, topk_experts, probs, check_cpu);
  detail::dispatch_router(probs.dtype(), [&]<class T>(std::type_identity<T>) {
    plan<T>(row_token.data<int32_t>(), row_prob.data<T>(), token_rows.data<int32_t>(),
            expert_offsets.data<int32_t>(), topk_experts.data<int32_t>(), probs.data<T>(), probs.dim(0),
            probs.dim(1), topk_experts.dim(1));
  });
}

void cpu::moe_route_losses(Tensor& values, const Tensor& sums, const TopKRouting& routing) {
  checks::check_moe_route_losses(values, sums, routing, check_cpu);
  const int64_t E = values.numel() - 2, B = routing.balancing_sequences;
  const double* s = sums.data<double>();
  const double all_tokens = s[0];
  double balancing = 0.0;
  if (B > 0) {
    const double norm = moe_routing_detail::balancing_norm(all_tokens, E, routing);
    const double* f = s + 1 + E;
    for (int64_t i = 0; i < B * E; ++i) balancing += norm * f[i] * f[B * E + i];
  }
  values.set_item(0, balancing);
  values.set_item(1, routing.z_loss ? s[1 + E + 2 * B * E] / all_tokens : 0.0);
  for (int64_t e = 0; e < E; ++e) values.set_item(2 + e, s[1 + e]);
}

void cpu::moe_route_backward(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& topk_experts,
                             const Tensor& sums, const TopKRouting& routing, double aux_loss_weight,
                             double z_loss_weight) {
  checks::check_moe_route_backward(dlogits, dprobs, logits, topk_experts, sums, routing, check_cpu);
  const int64_t T_ = logits.dim(0), E = logits.dim(1), B = routing.balancing_sequences;
  const double* s = sums.data<double>();
  const double norm = B > 0 ? moe_routing_detail::balancing_norm(s[0], E, routing) : 0.0;
  detail::dispatch_router(logits.dtype(), [&]<class T>(std::type_identity<T>) {
    for (int64_t t = 0; t < T_; ++t)
      moe_routing_detail::route_token_backward(
          logits.data<T>() + t * E, dprobs.data<T>() + t * E, topk_experts.data<int32_t>() + t * routing.topk,
          B > 0 ? s + 1 + E + (t % B) * E : nullptr, norm, E, routing, aux_loss_weight, z_loss_weight, s[0],
          dlogits.data<T>() + t * E);
  });
}

}  // namespace megatron::ops
