#include "megatron/transformer/moe/experts.h"

#include <cmath>

#include "megatron/ops/activation.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"

namespace megatron::moe {

Experts::Experts(ParameterRegistry& registry, const TransformerConfig& config, const std::string& prefix)
    : swiglu_(config.swiglu),
      grouped_gemm_(config.moe.moe_grouped_gemm),
      recompute_act_(config.recompute.recomputes("moe_act")) {
  const int64_t E = config.moe.num_moe_experts, H = config.hidden_size, F = config.moe.moe_ffn_hidden_size;
  // Expert tensor parallelism splits each expert as the dense MLP: fc1 by output rows in
  // [gate; up] blocks (column-parallel), fc2 by input columns (row-parallel).
  fc1_ = registry.add({.name = prefix + ".linear_fc1.weight",
                       .global_shape = {E, swiglu_ ? 2 * F : F, H},
                       .partition_dim = 1,
                       .partition_blocks = swiglu_ ? 2 : 1,
                       .init_std = config.init_method_std,
                       .expert_parallel = true,
                       .first_grad_overwrites = true});
  // fc2 as Megatron's output layers: std / sqrt(2 * layers).
  fc2_ = registry.add({.name = prefix + ".linear_fc2.weight",
                       .global_shape = {E, H, F},
                       .partition_dim = 2,
                       .init_std = config.init_method_std / std::sqrt(2.0f * float(config.num_layers)),
                       .expert_parallel = true,
                       .first_grad_overwrites = true});
}

void Experts::experts_linear(Tensor& out, const Tensor& in, const Parameter& weight,
                             const ops::ExpertRows& rows) const {
  if (grouped_gemm_) return ops::grouped_linear_forward(out, in, weight.data, rows);
  const std::vector<int64_t> counts = rows.host_counts();
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t end = begin + counts[e];
    if (end > begin) {
      Tensor out_e = out.slice(begin, end);
      ops::linear_forward(out_e, in.slice(begin, end), weight.data.select(int64_t(e)), Tensor());
    }
    begin = end;
  }
}

void Experts::experts_linear_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                                      const ops::ExpertRows& rows) const {
  // The step's first gradient is written over the main grad, which DDP did not zero
  // (first_grad_overwrites): no memset of the experts' grads and no read of zeros in their GEMMs.
  const ops::GradWrite write = weight.take_grad_overwrite() ? ops::GradWrite::overwrite : ops::GradWrite::accumulate;
  if (grouped_gemm_) return ops::grouped_linear_backward(dx, weight.main_grad, dy, x, weight.data, rows, write);
  const std::vector<int64_t> counts = rows.host_counts();
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t end = begin + counts[e];
    Tensor dw_e = weight.main_grad.select(int64_t(e));
    if (end > begin) {
      Tensor dx_e = dx.slice(begin, end);
      Tensor no_bias;
      ops::linear_backward(dx_e, dw_e, no_bias, dy.slice(begin, end), x.slice(begin, end),
                           weight.data.select(int64_t(e)), write);
    } else if (write == ops::GradWrite::overwrite) {
      dw_e.zero();
    }
    begin = end;
  }
}

Tensor Experts::activation(const Tensor& fc1_out) const {
  Tensor act = Tensor::empty({fc1_out.dim(0), fc2_->local_shape[2]}, fc1_out.dtype(), fc1_out.device());
  if (swiglu_)
    ops::swiglu_forward(act, fc1_out);
  else
    ops::gelu_forward(act, fc1_out);
  return act;
}

Tensor Experts::forward(const Tensor& rows, const ops::ExpertRows& expert_rows, Saved& saved) const {
  const int64_t N = rows.dim(0);
  saved.input = rows;
  // The per-expert loop needs the counts on the host, and so does the grouped op's per-expert
  // library path for large experts (grouped_gemm.h): read once here (device offsets) for the
  // forward and the backward, as Megatron's dispatcher reads them for its grouped GEMM.
  const bool large_experts = N >= ops::kPerExpertGemmRows * expert_rows.experts();
  saved.expert_rows = grouped_gemm_ && !large_experts ? expert_rows : ops::ExpertRows(expert_rows.host_counts());
  saved.fc1_out = Tensor::empty({N, fc1_->local_shape[1]}, rows.dtype(), rows.device());
  experts_linear(saved.fc1_out, rows, *fc1_, saved.expert_rows);
  const Tensor act = activation(saved.fc1_out);
  if (!recompute_act_) saved.act = act;
  Tensor out = Tensor::empty({N, rows.dim(1)}, rows.dtype(), rows.device());
  experts_linear(out, act, *fc2_, saved.expert_rows);
  return out;
}

Tensor Experts::backward(const Tensor& dy, const Saved& saved) const {
  const Tensor act = saved.act.defined() ? saved.act : activation(saved.fc1_out);
  Tensor dact = Tensor::empty(act.shape(), act.dtype(), act.device());
  experts_linear_backward(dact, dy, act, *fc2_, saved.expert_rows);
  Tensor dfc1 = Tensor::empty(saved.fc1_out.shape(), saved.fc1_out.dtype(), saved.fc1_out.device());
  if (swiglu_)
    ops::swiglu_backward(dfc1, dact, saved.fc1_out);
  else
    ops::gelu_backward(dfc1, dact, saved.fc1_out);
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  experts_linear_backward(dx, dfc1, saved.input, *fc1_, saved.expert_rows);
  return dx;
}

}  // namespace megatron::moe
