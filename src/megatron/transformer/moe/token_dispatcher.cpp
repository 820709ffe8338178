#include "megatron/transformer/moe/token_dispatcher.h"

#include "megatron/ops/moe_permute.h"
#include "megatron/ops/moe_routing.h"

namespace megatron::moe {

DispatchPlan plan_dispatch(const Routing& r, int64_t first_expert, int64_t num_experts, Device device,
                           DType weight_dtype) {
  const int64_t T = r.num_tokens, E = r.num_experts;
  int64_t N = 0;
  for (int64_t e = first_expert; e < first_expert + num_experts; ++e) N += r.tokens_per_expert[size_t(e)];
  Tensor row_token = Tensor::empty({N}, DType::i32), row_prob = Tensor::empty({N}, weight_dtype);
  Tensor token_rows = Tensor::empty({T, E}, DType::i32), probs = Tensor::empty({T, E}, weight_dtype);
  int32_t* tokens = row_token.data<int32_t>();
  int32_t* rows = token_rows.data<int32_t>();
  std::fill(rows, rows + T * E, -1);
  int64_t next = 0;
  for (int64_t e = first_expert; e < first_expert + num_experts; ++e) {
    for (int64_t t = 0; t < T; ++t) {
      if (!r.routed[size_t(t * E + e)]) continue;
      tokens[next] = int32_t(t);
      row_prob.set_item(next, r.probs[size_t(t * E + e)]);
      rows[t * E + e] = int32_t(next++);
    }
  }
  for (int64_t i = 0; i < T * E; ++i) probs.set_item(i, r.probs[size_t(i)]);
  const auto counts = r.tokens_per_expert.begin() + first_expert;
  return {row_token.to(device), row_prob.to(device), token_rows.to(device), probs.to(device),
          std::vector<int64_t>(counts, counts + num_experts)};
}

DispatchPlan plan_dispatch(const Tensor& probs, const Tensor& topk_experts) {
  const int64_t T = probs.dim(0), E = probs.dim(1), N = T * topk_experts.dim(1);
  const Device device = probs.device();
  Tensor row_token = Tensor::empty({N}, DType::i32, device), row_prob = Tensor::empty({N}, probs.dtype(), device);
  Tensor token_rows = Tensor::empty({T, E}, DType::i32, device), offsets = Tensor::empty({E + 1}, DType::i32, device);
  ops::moe_route_plan(row_token, row_prob, token_rows, offsets, topk_experts, probs);
  return {row_token, row_prob, token_rows, probs, ops::ExpertRows::on_device(offsets)};
}

Tensor gather_tokens(const Tensor& x, Communicator& ep) {
  Tensor all = Tensor::empty({ep.size() * x.dim(0), x.dim(1)}, x.dtype(), x.device());
  ep.all_gather(all, x);
  return all;
}

Routing gather_routing(const Routing& r, Communicator& ep, Device device) {
  const int64_t T = r.num_tokens, E = r.num_experts, ranks = ep.size();
  // One (T, 2E) f64 block per rank: [probs | routed].
  Tensor mine = Tensor::empty({T, 2 * E}, DType::f64);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      mine.set_item(t * 2 * E + e, r.probs[size_t(t * E + e)]);
      mine.set_item(t * 2 * E + E + e, r.routed[size_t(t * E + e)]);
    }
  Tensor all = Tensor::empty({ranks * T, 2 * E}, DType::f64, device);
  ep.all_gather(all, mine.to(device));
  const Tensor host = all.to(Device::cpu());
  Routing g{.num_tokens = ranks * T, .num_experts = E};
  g.probs.resize(size_t(ranks * T * E));
  g.routed.resize(size_t(ranks * T * E));
  g.tokens_per_expert.assign(size_t(E), 0);
  for (int64_t t = 0; t < ranks * T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      g.probs[size_t(t * E + e)] = host.item(t * 2 * E + e);
      g.routed[size_t(t * E + e)] = host.item(t * 2 * E + E + e) != 0.0;
      g.tokens_per_expert[size_t(e)] += g.routed[size_t(t * E + e)];
    }
  return g;
}

Tensor sum_to_token_ranks(const Tensor& partial, Communicator& ep) {
  Tensor mine = Tensor::empty({partial.dim(0) / ep.size(), partial.dim(1)}, partial.dtype(), partial.device());
  ep.reduce_scatter(mine, partial, ReduceOp::sum);
  return mine;
}

Tensor dispatch(const Tensor& x, const DispatchPlan& plan) {
  Tensor rows = Tensor::empty({plan.row_token.numel(), x.dim(1)}, x.dtype(), x.device());
  ops::moe_permute(rows, x, plan.row_token, Tensor());
  return rows;
}

Tensor combine(const Tensor& rows, const DispatchPlan& plan) {
  Tensor y = Tensor::empty({plan.token_rows.dim(0), rows.dim(1)}, rows.dtype(), rows.device());
  ops::moe_unpermute(y, rows, plan.token_rows, plan.probs);
  return y;
}

Tensor combine_backward(const Tensor& dy, const Tensor& rows, const DispatchPlan& plan, Tensor& dprobs) {
  dprobs = Tensor::empty(plan.probs.shape(), plan.probs.dtype(), dy.device());
  ops::moe_unpermute_weight_backward(dprobs, dy, rows, plan.token_rows);
  Tensor drows = Tensor::empty(rows.shape(), dy.dtype(), dy.device());
  ops::moe_permute(drows, dy, plan.row_token, plan.row_prob);
  return drows;
}

Tensor dispatch_backward(const Tensor& drows, const DispatchPlan& plan) {
  Tensor dx = Tensor::empty({plan.token_rows.dim(0), drows.dim(1)}, drows.dtype(), drows.device());
  ops::moe_unpermute(dx, drows, plan.token_rows, Tensor());
  return dx;
}

}  // namespace megatron::moe
