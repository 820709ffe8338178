#include "megatron/transformer/moe/token_dispatcher.h"

#include "megatron/ops/moe_permute.h"

namespace megatron::moe {

DispatchPlan plan_dispatch(const Routing& r, Device device, DType weight_dtype) {
  const int64_t T = r.num_tokens, E = r.num_experts;
  int64_t N = 0;
  for (int64_t n : r.tokens_per_expert) N += n;
  Tensor row_token = Tensor::empty({N}, DType::i32), row_prob = Tensor::empty({N}, weight_dtype);
  Tensor token_rows = Tensor::empty({T, E}, DType::i32), probs = Tensor::empty({T, E}, weight_dtype);
  int32_t* tokens = row_token.data<int32_t>();
  int32_t* rows = token_rows.data<int32_t>();
  std::fill(rows, rows + T * E, -1);
  int64_t next = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < T; ++t) {
      if (!r.routed[size_t(t * E + e)]) continue;
      tokens[next] = int32_t(t);
      row_prob.set_item(next, r.probs[size_t(t * E + e)]);
      rows[t * E + e] = int32_t(next++);
    }
  }
  for (int64_t i = 0; i < T * E; ++i) probs.set_item(i, r.probs[size_t(i)]);
  return {row_token.to(device), row_prob.to(device), token_rows.to(device), probs.to(device), r.tokens_per_expert};
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

Tensor combine_backward(const Tensor& dy, const Tensor& rows, const DispatchPlan& plan, std::vector<double>& dprobs) {
  Tensor dweight = Tensor::empty(plan.probs.shape(), plan.probs.dtype(), dy.device());
  ops::moe_unpermute_weight_backward(dweight, dy, rows, plan.token_rows);
  const Tensor host = dweight.to(Device::cpu());
  dprobs.resize(size_t(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) dprobs[size_t(i)] = host.item(i);
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
