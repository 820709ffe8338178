#include "megatron/tensor_parallel/layers.h"

#include "megatron/ops/embedding.h"
#include "megatron/ops/gemm.h"
#include "megatron/tensor_parallel/mappings.h"

namespace megatron::tensor_parallel {

namespace {
Tensor rows_view(const Tensor& t) { return t.view({-1, t.dim(-1)}); }  // (S,B,C) -> (N,C)

Tensor new_activation(const Tensor& like, int64_t last_dim, DType dtype) {
  return Tensor::empty({like.dim(0), like.dim(1), last_dim}, dtype, like.device());
}

Tensor undefined_if_null(const Parameter* p, Tensor Parameter::*member) { return p ? p->*member : Tensor(); }
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx,
                                           const std::string& prefix, int64_t input_size, int64_t output_size,
                                           const Options& options)
    : ctx_(&ctx) {
  const int tp = ctx.tp_size();
  MEGATRON_CHECK(output_size % tp == 0, prefix << ": output size " << output_size << " is not divisible by TP " << tp);
  output_per_partition_ = output_size / tp;
  if (options.shared_weight != nullptr) {
    weight_ = options.shared_weight;
    MEGATRON_CHECK(weight_->spec.global_shape == (Shape{output_size, input_size}),
                   prefix << ": shared weight " << weight_->spec.name << " has shape "
                          << shape_str(weight_->spec.global_shape) << ", expected [" << output_size << ", "
                          << input_size << "]");
  } else {
    weight_ = registry.add({.name = prefix + ".weight",
                            .global_shape = {output_size, input_size},
                            .partition_dim = 0,
                            .partition_blocks = options.partition_blocks,
                            .init_std = options.init_std},
                           ctx.tp_rank(), tp);
  }
  if (options.bias)
    bias_ = registry.add({.name = prefix + ".bias",
                          .global_shape = {output_size},
                          .partition_dim = 0,
                          .partition_blocks = options.partition_blocks,
                          .init = InitMethod::zeros,
                          .weight_decay = false},
                         ctx.tp_rank(), tp);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearSaved& saved, Tensor* gelu_pre) const {
  copy_to_tp_forward(x, *ctx_);
  Tensor y = new_activation(x, output_per_partition_, x.dtype());
  Tensor y2 = rows_view(y);
  if (gelu_pre != nullptr) {
    *gelu_pre = new_activation(x, output_per_partition_, x.dtype());
    Tensor pre2 = rows_view(*gelu_pre);
    ops::linear_gelu_forward(y2, pre2, rows_view(x), weight_->data, undefined_if_null(bias_, &Parameter::data));
  } else {
    ops::linear_forward(y2, rows_view(x), weight_->data, undefined_if_null(bias_, &Parameter::data));
  }
  saved.input = x;
  return y;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const LinearSaved& saved) const {
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor dx2 = rows_view(dx);
  Tensor dbias = undefined_if_null(bias_, &Parameter::main_grad);
  ops::linear_backward(dx2, weight_->main_grad, dbias, rows_view(dy), rows_view(saved.input), weight_->data);
  copy_to_tp_backward(dx, *ctx_);
  return dx;
}

RowParallelLinear::RowParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx, const std::string& prefix,
                                     int64_t input_size, int64_t output_size, const Options& options)
    : ctx_(&ctx) {
  weight_ = registry.add({.name = prefix + ".weight",
                          .global_shape = {output_size, input_size},
                          .partition_dim = 1,
                          .init_std = options.init_std},
                         ctx.tp_rank(), ctx.tp_size());
  // The bias is replicated and must be added once, after the all-reduce; the TP issue adds that
  // path. At TP=1 it fuses into the GEMM.
  MEGATRON_CHECK(!options.bias || ctx.tp_size() == 1,
                 prefix << ": a RowParallelLinear bias with TP>1 is not supported yet; use --disable-bias-linear");
  if (options.bias)
    bias_ = registry.add(
        {.name = prefix + ".bias", .global_shape = {output_size}, .init = InitMethod::zeros, .weight_decay = false},
        ctx.tp_rank(), ctx.tp_size());
}

Tensor RowParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  Tensor y = new_activation(x, weight_->local_shape[0], x.dtype());
  Tensor y2 = rows_view(y);
  ops::linear_forward(y2, rows_view(x), weight_->data, undefined_if_null(bias_, &Parameter::data));
  reduce_from_tp_forward(y, *ctx_);
  saved.input = x;
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const LinearSaved& saved, const Tensor& gelu_pre) const {
  reduce_from_tp_backward(dy, *ctx_);
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor dx2 = rows_view(dx);
  Tensor dbias = undefined_if_null(bias_, &Parameter::main_grad);
  if (gelu_pre.defined()) {
    ops::gelu_linear_backward(dx2, weight_->main_grad, dbias, rows_view(dy), rows_view(saved.input), weight_->data,
                              rows_view(gelu_pre));
  } else {
    ops::linear_backward(dx2, weight_->main_grad, dbias, rows_view(dy), rows_view(saved.input), weight_->data);
  }
  return dx;
}

VocabParallelEmbedding::VocabParallelEmbedding(ParameterRegistry& registry, const ParallelContext& ctx,
                                               const std::string& name, int64_t padded_vocab_size, int64_t hidden_size,
                                               float init_std)
    : ctx_(&ctx) {
  weight_ = registry.add(
      {.name = name, .global_shape = {padded_vocab_size, hidden_size}, .partition_dim = 0, .init_std = init_std},
      ctx.tp_rank(), ctx.tp_size());
  vocab_start_ = ctx.tp_rank() * weight_->local_shape[0];
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens) const {
  Tensor out = Tensor::empty({tokens.dim(1), tokens.dim(0), weight_->local_shape[1]}, weight_->data.dtype(),
                             weight_->data.device());
  ops::embedding_forward(out, tokens, weight_->data, {.vocab_start = vocab_start_});
  reduce_from_tp_forward(out, *ctx_);
  return out;
}

void VocabParallelEmbedding::backward(const Tensor& dout, const Tensor& tokens) const {
  reduce_from_tp_backward(dout, *ctx_);
  ops::embedding_backward(weight_->main_grad, dout, tokens, {.vocab_start = vocab_start_});
}

}  // namespace megatron::tensor_parallel
