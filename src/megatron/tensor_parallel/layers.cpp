#include "megatron/tensor_parallel/layers.h"

#include "megatron/ops/embedding.h"
#include "megatron/ops/gemm.h"
#include "megatron/tensor_parallel/mappings.h"
#include "megatron/tensor_parallel/ring_overlap.h"

namespace megatron::tensor_parallel {

namespace {
Tensor rows_view(const Tensor& t) { return t.view({-1, t.dim(-1)}); }  // (S,B,C) -> (N,C)

Tensor new_activation(const Tensor& like, int64_t last_dim, DType dtype) {
  return Tensor::empty({like.dim(0), like.dim(1), last_dim}, dtype, like.device());
}

// Rows [c*rows, (c+1)*rows) of dim 0: sequence chunk c of an (S,B,C) tensor.
Tensor sequence_chunk(const Tensor& t, int c, int64_t rows) { return t.slice(c * rows, (c + 1) * rows); }

Tensor undefined_if_null(const Parameter* p, Tensor Parameter::*member) { return p ? p->*member : Tensor(); }

// The replicated bias of a row-parallel layer, added once after the reduction:
//   forward  y (N,out) += 1 b^T     backward  db (out) += dy^T 1
// Rank-1 GEMMs, so every backend and dtype has them, and db accumulates in the main grad's
// dtype (f32 for 16-bit activations) like the fused bias of the TP=1 GEMM. `ones` is (N,1).
void add_bias_forward(Tensor& y, const Tensor& bias, const Tensor& ones) {
  Tensor y2 = rows_view(y);
  ops::matmul(y2, ones, bias.view({1, -1}), {.beta = 1.0f});
}
void add_bias_backward(Tensor& dbias, const Tensor& dy, const Tensor& ones) {
  Tensor db = dbias.view({-1, 1});
  ops::matmul(db, rows_view(dy), ones, {.trans_a = ops::Transpose::yes, .beta = 1.0f});
}

// The layer's GEMMs: in FP8 when the layer has FP8 scaling state (fp8_linear.h), else the ops'.
void linear_forward(Fp8Linear* fp8, Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (fp8 != nullptr)
    fp8->linear_forward(y, x, weight, bias);
  else
    ops::linear_forward(y, x, weight, bias);
}
void linear_gelu_forward(Fp8Linear* fp8, Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight,
                         const Tensor& bias) {
  if (fp8 != nullptr)
    fp8->linear_gelu_forward(y, pre, x, weight, bias);
  else
    ops::linear_gelu_forward(y, pre, x, weight, bias);
}
void linear_backward(Fp8Linear* fp8, Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& weight) {
  if (fp8 != nullptr)
    fp8->linear_backward(dx, dweight, dbias, dy, x, weight);
  else
    ops::linear_backward(dx, dweight, dbias, dy, x, weight);
}
void gelu_linear_backward(Fp8Linear* fp8, Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy,
                          const Tensor& x, const Tensor& weight, const Tensor& pre) {
  if (fp8 != nullptr)
    fp8->gelu_linear_backward(dpre, dweight, dbias, dy, x, weight, pre);
  else
    ops::gelu_linear_backward(dpre, dweight, dbias, dy, x, weight, pre);
}

// Megatron's amax reduction group, TP x DP x CP, as its two factors.
std::unique_ptr<Fp8Linear> make_fp8(const std::optional<ops::Fp8Recipe>& recipe, const ParallelContext& ctx,
                                    const std::string& name) {
  return recipe ? std::make_unique<Fp8Linear>(name, *recipe, std::vector{ctx.tp, ctx.dp_cp}) : nullptr;
}

// The registry cuts the shards and the context's TP group communicates: one TP layout for both.
void check_same_tp(const ParameterRegistry& registry, const ParallelContext& ctx, const std::string& name) {
  MEGATRON_CHECK(registry.tp_rank() == ctx.tp_rank() && registry.tp_size() == ctx.tp_size(),
                 name << ": the parameter registry holds TP rank " << registry.tp_rank() << " of " << registry.tp_size()
                      << " but the context's TP group is rank " << ctx.tp_rank() << " of " << ctx.tp_size()
                      << "; build the registry from the context's TP rank and size");
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx,
                                           const std::string& prefix, int64_t input_size, int64_t output_size,
                                           const Options& options)
    : ctx_(&ctx),
      sequence_parallel_(ctx.sequence_parallel()),
      tp_comm_overlap_(ctx.tp_comm_overlap()),
      fp8_(make_fp8(options.fp8, ctx, prefix)) {
  check_same_tp(registry, ctx, prefix);
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
                            .init_std = options.init_std});
  }
  if (options.bias)
    bias_ = registry.add({.name = prefix + ".bias",
                          .global_shape = {output_size},
                          .partition_dim = 0,
                          .partition_blocks = options.partition_blocks,
                          .init = InitMethod::zeros,
                          .weight_decay = false});
}

void ColumnParallelLinear::gemm_forward(const Tensor& input, Tensor& y, Tensor* gelu_pre) const {
  Tensor y2 = rows_view(y);
  const Tensor bias = undefined_if_null(bias_, &Parameter::data);
  if (gelu_pre != nullptr) {
    Tensor pre2 = rows_view(*gelu_pre);
    linear_gelu_forward(fp8_.get(), y2, pre2, rows_view(input), weight_->data, bias);
  } else {
    linear_forward(fp8_.get(), y2, rows_view(input), weight_->data, bias);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearSaved& saved, Tensor* gelu_pre) const {
  saved.input = x;
  const int64_t rows = sequence_parallel_ ? x.dim(0) * ctx_->tp_size() : x.dim(0);
  Tensor y = Tensor::empty({rows, x.dim(1), output_per_partition_}, x.dtype(), x.device());
  if (gelu_pre != nullptr) *gelu_pre = Tensor::empty(y.shape(), x.dtype(), x.device());
  if (tp_comm_overlap_) {
    all_gather_sequence_overlapped(x, *ctx_, [&](int c, const Tensor& input) {
      Tensor y_c = sequence_chunk(y, c, x.dim(0));
      Tensor pre_c = gelu_pre != nullptr ? sequence_chunk(*gelu_pre, c, x.dim(0)) : Tensor();
      gemm_forward(input, y_c, gelu_pre != nullptr ? &pre_c : nullptr);
    });
    return y;
  }
  Tensor input = x;
  if (sequence_parallel_)
    input = gather_from_sequence_parallel_forward(x, *ctx_);
  else
    copy_to_tp_forward(x, *ctx_);
  gemm_forward(input, y, gelu_pre);
  return y;
}

// With TP: dX first, then dW (and db) while dX's reduction runs; under SP, dX also hides the
// input's re-gather, which only dW needs.
Tensor ColumnParallelLinear::backward(const Tensor& dy, const LinearSaved& saved) const {
  Tensor dbias = undefined_if_null(bias_, &Parameter::main_grad);
  if (ctx_->tp_size() == 1) {
    Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
    Tensor dx2 = rows_view(dx);
    linear_backward(fp8_.get(), dx2, weight_->main_grad, dbias, rows_view(dy), rows_view(saved.input), weight_->data);
    return dx;
  }
  Pending gathered{saved.input, nullptr};
  if (sequence_parallel_) gathered = gather_from_sequence_parallel_forward_async(saved.input, *ctx_);
  Tensor dx = Tensor::empty({dy.dim(0), dy.dim(1), saved.input.dim(-1)}, dy.dtype(), dy.device());
  Tensor dx2 = rows_view(dx), no_weight_grad, no_bias_grad;
  // x is only read for dW: the gathered input passes its shape while it is still arriving.
  linear_backward(fp8_.get(), dx2, no_weight_grad, no_bias_grad, rows_view(dy), rows_view(gathered.result),
                  weight_->data);
  const Tensor input = gathered.handle ? gathered.wait() : gathered.result;
  Pending reduced = sequence_parallel_ ? gather_from_sequence_parallel_backward_async(dx, *ctx_)
                                       : copy_to_tp_backward_async(dx, *ctx_);
  Tensor no_input_grad;
  linear_backward(fp8_.get(), no_input_grad, weight_->main_grad, dbias, rows_view(dy), rows_view(input), weight_->data);
  return reduced.wait();
}

RowParallelLinear::RowParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx, const std::string& prefix,
                                     int64_t input_size, int64_t output_size, const Options& options)
    : ctx_(&ctx),
      sequence_parallel_(ctx.sequence_parallel()),
      tp_comm_overlap_(ctx.tp_comm_overlap()),
      fp8_(make_fp8(options.fp8, ctx, prefix)) {
  check_same_tp(registry, ctx, prefix);
  weight_ = registry.add({.name = prefix + ".weight",
                          .global_shape = {output_size, input_size},
                          .partition_dim = 1,
                          .init_std = options.init_std});
  // Replicated; under SP each rank's gradient covers its sequence shard only, so it is summed
  // over TP before the optimizer (finalize_model_grads).
  if (options.bias)
    bias_ = registry.add({.name = prefix + ".bias",
                          .global_shape = {output_size},
                          .init = InitMethod::zeros,
                          .weight_decay = false,
                          .sequence_parallel = sequence_parallel_});
}

// At TP=1 the bias fuses into the GEMM; with TP>1 it is added after the reduction, once.
Tensor RowParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  const bool fused_bias = ctx_->tp_size() == 1;
  const int64_t out_features = weight_->local_shape[0];
  Tensor y;
  if (tp_comm_overlap_) {
    const int64_t rows = sequence_shard_rows(x, *ctx_);
    y = reduce_scatter_sequence_overlapped(
        {rows, x.dim(1), out_features}, x.dtype(), x.device(), *ctx_, [&](int c, Tensor& partial) {
          Tensor partial2 = rows_view(partial);
          linear_forward(fp8_.get(), partial2, rows_view(sequence_chunk(x, c, rows)), weight_->data, Tensor());
        });
  } else {
    y = new_activation(x, out_features, x.dtype());
    Tensor y2 = rows_view(y);
    linear_forward(fp8_.get(), y2, rows_view(x), weight_->data,
                   fused_bias ? undefined_if_null(bias_, &Parameter::data) : Tensor());
    if (sequence_parallel_)
      y = reduce_scatter_to_sequence_parallel_forward(y, *ctx_);
    else
      reduce_from_tp_forward(y, *ctx_);
  }
  if (bias_ && !fused_bias) add_bias_forward(y, bias_->data, ones_column(y));
  saved.input = x;
  return y;
}

// Built on the host once and kept: rebuilding it on a GPU would cost a synchronous copy per call.
const Tensor& RowParallelLinear::ones_column(const Tensor& like) const {
  const int64_t n = like.numel() / like.dim(-1);
  if (!ones_.defined() || ones_.dim(0) != n || ones_.dtype() != like.dtype() || ones_.device() != like.device()) {
    Tensor host = Tensor::empty({n, 1}, like.dtype());
    host.fill(1.0);
    ones_ = host.to(like.device());
  }
  return ones_;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const LinearSaved& saved, const Tensor& gelu_pre) const {
  const bool fused_bias = ctx_->tp_size() == 1;
  if (bias_ && !fused_bias) add_bias_backward(bias_->main_grad, dy, ones_column(dy));
  if (tp_comm_overlap_) {
    // dX chunk by chunk as dY's chunks arrive, then dW from the whole gathered dY.
    Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
    const int64_t rows = dy.dim(0);
    const Tensor dy_full = all_gather_sequence_overlapped(dy, *ctx_, [&](int c, const Tensor& dy_c) {
      Tensor dx_c = rows_view(sequence_chunk(dx, c, rows)), no_weight_grad, no_bias_grad;
      const Tensor x_c = rows_view(sequence_chunk(saved.input, c, rows));
      if (gelu_pre.defined())
        gelu_linear_backward(fp8_.get(), dx_c, no_weight_grad, no_bias_grad, rows_view(dy_c), x_c, weight_->data,
                             rows_view(sequence_chunk(gelu_pre, c, rows)));
      else
        linear_backward(fp8_.get(), dx_c, no_weight_grad, no_bias_grad, rows_view(dy_c), x_c, weight_->data);
    });
    Tensor no_input_grad, no_bias_grad;
    linear_backward(fp8_.get(), no_input_grad, weight_->main_grad, no_bias_grad, rows_view(dy_full),
                    rows_view(saved.input), weight_->data);
    return dx;
  }
  Tensor dy_full = dy;
  if (sequence_parallel_)
    dy_full = reduce_scatter_to_sequence_parallel_backward(dy, *ctx_);
  else
    reduce_from_tp_backward(dy, *ctx_);
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor dx2 = rows_view(dx);
  Tensor dbias = fused_bias ? undefined_if_null(bias_, &Parameter::main_grad) : Tensor();
  if (gelu_pre.defined()) {
    gelu_linear_backward(fp8_.get(), dx2, weight_->main_grad, dbias, rows_view(dy_full), rows_view(saved.input),
                         weight_->data, rows_view(gelu_pre));
  } else {
    linear_backward(fp8_.get(), dx2, weight_->main_grad, dbias, rows_view(dy_full), rows_view(saved.input),
                    weight_->data);
  }
  return dx;
}

VocabParallelEmbedding::VocabParallelEmbedding(ParameterRegistry& registry, const ParallelContext& ctx,
                                               const std::string& name, int64_t padded_vocab_size, int64_t hidden_size,
                                               float init_std)
    : ctx_(&ctx), sequence_parallel_(ctx.sequence_parallel()) {
  check_same_tp(registry, ctx, name);
  weight_ = registry.add(
      {.name = name, .global_shape = {padded_vocab_size, hidden_size}, .partition_dim = 0, .init_std = init_std});
  vocab_start_ = ctx.tp_rank() * weight_->local_shape[0];
}

// Ids outside this rank's rows look up zeros (ops::embedding_forward), so the sum over TP is the
// full lookup.
Tensor VocabParallelEmbedding::forward(const Tensor& tokens) const {
  Tensor out = Tensor::empty({tokens.dim(1), tokens.dim(0), weight_->local_shape[1]}, weight_->data.dtype(),
                             weight_->data.device());
  ops::embedding_forward(out, tokens, weight_->data, {.vocab_start = vocab_start_});
  if (sequence_parallel_) return reduce_scatter_to_sequence_parallel_forward(out, *ctx_);
  reduce_from_tp_forward(out, *ctx_);
  return out;
}

void VocabParallelEmbedding::backward(const Tensor& dout, const Tensor& tokens) const {
  Tensor d = dout;
  if (sequence_parallel_)
    d = reduce_scatter_to_sequence_parallel_backward(dout, *ctx_);
  else
    reduce_from_tp_backward(dout, *ctx_);
  ops::embedding_backward(weight_->main_grad, d, tokens, {.vocab_start = vocab_start_});
}

}  // namespace megatron::tensor_parallel
