#include "megatron/tensor_parallel/layers.h"

#include "megatron/ops/embedding.h"
#include "megatron/ops/gemm.h"
#include "megatron/tensor_parallel/mappings.h"
#include "megatron/tensor_parallel/ring_overlap.h"

namespace megatron::tensor_parallel {

namespace {
Tensor rows_view(const Tensor& t) { return t.view({-1, t.dim(-1)}); }  // (S,B,C) -> (N,C)

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
// x_t: where to keep (forward) or where to find (backward) the FP8 cast of x^T, null for none;
// the bf16 GEMMs have none.
using Quantized = Fp8Linear::Quantized;
void linear_forward(Fp8Linear* fp8, Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    Quantized* x_t) {
  if (fp8 != nullptr)
    fp8->linear_forward(y, x, weight, bias, x_t);
  else
    ops::linear_forward(y, x, weight, bias);
}
void linear_gelu_forward(Fp8Linear* fp8, Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, Quantized* x_t) {
  if (fp8 != nullptr)
    fp8->linear_gelu_forward(y, pre, x, weight, bias, x_t);
  else
    ops::linear_gelu_forward(y, pre, x, weight, bias);
}
// dy as a tensor (rows) or as its casts (exactly one given); x may be undefined where x_t is given.
// weight_grad: the weight's main grad and how to write it (weight_grad_of), or undefined: dx only.
struct WeightGrad {
  Tensor grad;
  ops::GradWrite write = ops::GradWrite::accumulate;
};
// The weight's main grad as this backward writes it: over the buffer when zero_grads_lazily left
// it for this layer's first gradient of the step, added after.
WeightGrad weight_grad_of(Parameter& weight) {
  return {weight.main_grad, weight.take_grad_overwrite() ? ops::GradWrite::overwrite : ops::GradWrite::accumulate};
}
void linear_backward(Fp8Linear* fp8, Tensor& dx, WeightGrad dweight, Tensor& dbias, const Tensor* dy,
                     const Fp8Activation* dy_cast, const Tensor& x, const Tensor& weight, const Quantized* x_t) {
  if (dy_cast != nullptr) {
    MEGATRON_CHECK(!dbias.defined(), "an FP8-cast output gradient gives no bias gradient");
    fp8->linear_backward(dx, dweight.grad, dy_cast->casts, x, weight, dweight.write, x_t);
  } else if (fp8 != nullptr) {
    fp8->linear_backward(dx, dweight.grad, dbias, rows_view(*dy), x, weight, dweight.write, x_t);
  } else {
    ops::linear_backward(dx, dweight.grad, dbias, rows_view(*dy), x, weight, dweight.write);
  }
}
void gelu_linear_backward(Fp8Linear* fp8, Tensor& dpre, WeightGrad dweight, Tensor& dbias, const Tensor& dy,
                          const Tensor& x, const Tensor& weight, const Tensor& pre, const Quantized* x_t) {
  if (fp8 != nullptr)
    fp8->gelu_linear_backward(dpre, dweight.grad, dbias, dy, x, weight, pre, dweight.write, x_t);
  else
    ops::gelu_linear_backward(dpre, dweight.grad, dbias, dy, x, weight, pre, dweight.write);
}

// x^T's saved cast where the forward made one, else null; x's rows where it is kept.
const Quantized* saved_input_t(const LinearSaved& saved) {
  return saved.input_t.codes.defined() ? &saved.input_t : nullptr;
}
Tensor rows_or_undefined(const Tensor& t) { return t.defined() ? rows_view(t) : Tensor(); }

// Megatron's amax reduction group, TP x DP x CP, as its two factors.
std::unique_ptr<Fp8Linear> make_fp8(const std::optional<ops::Fp8Recipe>& recipe, const ParallelContext& ctx,
                                    const std::string& name) {
  return recipe ? std::make_unique<Fp8Linear>(name, *recipe, std::vector{ctx.tp, ctx.dp_cp}) : nullptr;
}

// --fp8-param-gather: the weight held as FP8 codes cast with the layer's weight scale.
void hold_in_fp8(Parameter& weight, Fp8Linear* fp8, bool fp8_param) {
  if (!fp8_param) return;
  MEGATRON_CHECK(fp8 != nullptr, weight.spec.name << ": an FP8 parameter needs the layer's GEMMs in FP8");
  weight.fp8 = Parameter::Fp8Weight{fp8->recipe(), &fp8->weight_scaling()};
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
                            .init_std = options.init_std,
                            .first_grad_overwrites = true});
    hold_in_fp8(*weight_, fp8_.get(), options.fp8_param);
  }
  MEGATRON_CHECK(!options.fp8_param || options.shared_weight == nullptr,
                 prefix << ": a shared weight stays in the compute dtype; no FP8 parameter");
  if (options.bias)
    bias_ = registry.add({.name = prefix + ".bias",
                          .global_shape = {output_size},
                          .partition_dim = 0,
                          .partition_blocks = options.partition_blocks,
                          .init = InitMethod::zeros,
                          .weight_decay = false});
}

void ColumnParallelLinear::gemm_forward(const Tensor& input, Tensor& y, Tensor* gelu_pre, Quantized* input_t) const {
  Tensor y2 = rows_view(y);
  const Tensor bias = undefined_if_null(bias_, &Parameter::data);
  if (gelu_pre != nullptr) {
    Tensor pre2 = rows_view(*gelu_pre);
    linear_gelu_forward(fp8_.get(), y2, pre2, rows_view(input), weight_->data, bias, input_t);
  } else {
    linear_forward(fp8_.get(), y2, rows_view(input), weight_->data, bias, input_t);
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
      gemm_forward(input, y_c, gelu_pre != nullptr ? &pre_c : nullptr, nullptr);
    });
    return y;
  }
  Tensor input = x;
  if (sequence_parallel_)
    input = gather_from_sequence_parallel_forward(x, *ctx_);
  else
    copy_to_tp_forward(x, *ctx_);
  // Under SP the backward gathers the input shard again (keeping a cast of the whole gathered
  // input would cost more than the shard), so only the unsharded input's cast is kept.
  gemm_forward(input, y, gelu_pre, fp8_ && !sequence_parallel_ ? &saved.input_t : nullptr);
  return y;
}

Tensor ColumnParallelLinear::forward(const Fp8Activation& x, LinearSaved& saved) const {
  MEGATRON_CHECK(takes_fp8_input(),
                 "ColumnParallelLinear: an FP8-cast input needs an FP8 layer under the delayed recipe "
                 "without sequence parallelism or --tp-comm-overlap");
  Tensor y = Tensor::empty({x.shape[0], x.shape[1], output_per_partition_}, x.dtype, weight_->data.device());
  Tensor y2 = rows_view(y);
  fp8_->linear_forward(y2, x.casts, weight_->data, undefined_if_null(bias_, &Parameter::data));
  saved.input_t = x.casts.transposed;  // the backward's x^T; x itself is never stored
  return y;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const LinearSaved& saved) const {
  return backward(&dy, nullptr, saved);
}
Tensor ColumnParallelLinear::backward(const Fp8Activation& dy, const LinearSaved& saved) const {
  MEGATRON_CHECK(takes_fp8_grad_output(),
                 "ColumnParallelLinear: an FP8-cast output gradient needs an FP8 layer "
                 "under the delayed recipe without bias");
  return backward(nullptr, &dy, saved);
}

// With TP: dX first, then dW (and db) while dX's reduction runs; under SP, dX also hides the
// input's re-gather, which only dW needs.
Tensor ColumnParallelLinear::backward(const Tensor* dy, const Fp8Activation* dy_cast, const LinearSaved& saved) const {
  const Shape& dy_shape = dy != nullptr ? dy->shape() : dy_cast->shape;
  const DType dtype = dy != nullptr ? dy->dtype() : dy_cast->dtype;
  // dx (S,B,in): the whole sequence under SP too, reduce-scattered after.
  Tensor dx = Tensor::empty({dy_shape[0], dy_shape[1], weight_->local_shape[1]}, dtype, weight_->data.device());
  Tensor dx2 = rows_view(dx), dbias = undefined_if_null(bias_, &Parameter::main_grad);
  const Quantized* input_t = saved_input_t(saved);
  if (ctx_->tp_size() == 1) {
    linear_backward(fp8_.get(), dx2, weight_grad_of(*weight_), dbias, dy, dy_cast, rows_or_undefined(saved.input),
                    weight_->data, input_t);
    return dx;
  }
  Pending gathered{saved.input, nullptr};
  if (sequence_parallel_) gathered = gather_from_sequence_parallel_forward_async(saved.input, *ctx_);
  Tensor no_bias_grad;
  // x is only read for dW: the gathered input passes its shape (bf16 GEMMs check it) while it is
  // still arriving.
  linear_backward(fp8_.get(), dx2, {}, no_bias_grad, dy, dy_cast, rows_or_undefined(gathered.result), weight_->data,
                  nullptr);
  const Tensor input = gathered.handle ? gathered.wait() : gathered.result;
  Pending reduced = sequence_parallel_ ? gather_from_sequence_parallel_backward_async(dx, *ctx_)
                                       : copy_to_tp_backward_async(dx, *ctx_);
  Tensor no_input_grad;
  linear_backward(fp8_.get(), no_input_grad, weight_grad_of(*weight_), dbias, dy, dy_cast, rows_or_undefined(input),
                  weight_->data, input_t);
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
                          .init_std = options.init_std,
                          .first_grad_overwrites = true});
  hold_in_fp8(*weight_, fp8_.get(), options.fp8_param);
  // Replicated; under SP each rank's gradient covers its sequence shard only, so it is summed
  // over TP before the optimizer (finalize_model_grads).
  if (options.bias)
    bias_ = registry.add({.name = prefix + ".bias",
                          .global_shape = {output_size},
                          .init = InitMethod::zeros,
                          .weight_decay = false,
                          .sequence_parallel = sequence_parallel_});
}

Tensor RowParallelLinear::forward(const Tensor& x, LinearSaved& saved) const { return forward(&x, nullptr, saved); }
Tensor RowParallelLinear::forward(const Fp8Activation& x, LinearSaved& saved) const {
  MEGATRON_CHECK(takes_fp8_input(),
                 "RowParallelLinear: an FP8-cast input needs an FP8 layer under the delayed recipe "
                 "without --tp-comm-overlap");
  return forward(nullptr, &x, saved);
}

// At TP=1 the bias fuses into the GEMM; with TP>1 it is added after the reduction, once.
Tensor RowParallelLinear::forward(const Tensor* x, const Fp8Activation* x_cast, LinearSaved& saved) const {
  const bool fused_bias = ctx_->tp_size() == 1;
  const int64_t out_features = weight_->local_shape[0];
  Tensor y;
  if (tp_comm_overlap_) {
    const int64_t rows = sequence_shard_rows(*x, *ctx_);
    y = reduce_scatter_sequence_overlapped(
        {rows, x->dim(1), out_features}, x->dtype(), x->device(), *ctx_, [&](int c, Tensor& partial) {
          Tensor partial2 = rows_view(partial);
          linear_forward(fp8_.get(), partial2, rows_view(sequence_chunk(*x, c, rows)), weight_->data, Tensor(),
                         nullptr);
        });
    saved.input = *x;
  } else {
    const Shape& shape = x != nullptr ? x->shape() : x_cast->shape;
    y = Tensor::empty({shape[0], shape[1], out_features}, x != nullptr ? x->dtype() : x_cast->dtype,
                      weight_->data.device());
    Tensor y2 = rows_view(y);
    const Tensor bias = fused_bias ? undefined_if_null(bias_, &Parameter::data) : Tensor();
    if (x_cast != nullptr) {
      fp8_->linear_forward(y2, x_cast->casts, weight_->data, bias);
      saved.input_t = x_cast->casts.transposed;
    } else {
      linear_forward(fp8_.get(), y2, rows_view(*x), weight_->data, bias, fp8_ ? &saved.input_t : nullptr);
      saved.input = *x;
    }
    if (sequence_parallel_)
      y = reduce_scatter_to_sequence_parallel_forward(y, *ctx_);
    else
      reduce_from_tp_forward(y, *ctx_);
  }
  if (bias_ && !fused_bias) add_bias_forward(y, bias_->data, ones_column(y));
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
      Tensor dx_c = rows_view(sequence_chunk(dx, c, rows)), no_bias_grad;
      const Tensor x_c = rows_view(sequence_chunk(saved.input, c, rows));
      if (gelu_pre.defined())
        gelu_linear_backward(fp8_.get(), dx_c, {}, no_bias_grad, rows_view(dy_c), x_c, weight_->data,
                             rows_view(sequence_chunk(gelu_pre, c, rows)), nullptr);
      else
        linear_backward(fp8_.get(), dx_c, {}, no_bias_grad, &dy_c, nullptr, x_c, weight_->data, nullptr);
    });
    Tensor no_input_grad, no_bias_grad;
    linear_backward(fp8_.get(), no_input_grad, weight_grad_of(*weight_), no_bias_grad, &dy_full, nullptr,
                    rows_view(saved.input), weight_->data, nullptr);
    return dx;
  }
  Tensor dy_full = dy;
  if (sequence_parallel_)
    dy_full = reduce_scatter_to_sequence_parallel_backward(dy, *ctx_);
  else
    reduce_from_tp_backward(dy, *ctx_);
  Tensor dx = Tensor::empty({dy_full.dim(0), dy_full.dim(1), weight_->local_shape[1]}, dy.dtype(), dy.device());
  Tensor dx2 = rows_view(dx);
  Tensor dbias = fused_bias ? undefined_if_null(bias_, &Parameter::main_grad) : Tensor();
  const Tensor x = rows_or_undefined(saved.input);
  if (gelu_pre.defined()) {
    gelu_linear_backward(fp8_.get(), dx2, weight_grad_of(*weight_), dbias, rows_view(dy_full), x, weight_->data,
                         rows_view(gelu_pre), saved_input_t(saved));
  } else {
    linear_backward(fp8_.get(), dx2, weight_grad_of(*weight_), dbias, &dy_full, nullptr, x, weight_->data,
                    saved_input_t(saved));
  }
  return dx;
}

VocabParallelEmbedding::VocabParallelEmbedding(ParameterRegistry& registry, const ParallelContext& ctx,
                                               const std::string& name, int64_t padded_vocab_size, int64_t hidden_size,
                                               float init_std, bool deterministic)
    : ctx_(&ctx), sequence_parallel_(ctx.sequence_parallel()), deterministic_(deterministic) {
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
  ops::embedding_backward(weight_->main_grad, d, tokens,
                          {.vocab_start = vocab_start_, .deterministic = deterministic_});
}

}  // namespace megatron::tensor_parallel
