#include "megatron/tensor_parallel/fp8_linear.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "megatron/core/error.h"
#include "megatron/ops/activation.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"

namespace megatron::tensor_parallel {

Fp8Linear::Fp8Linear(std::string name, const ops::Fp8Recipe& recipe,
                     std::vector<std::shared_ptr<Communicator>> amax_groups)
    : name_(std::move(name)), recipe_(recipe), amax_groups_(std::move(amax_groups)) {
  input_.dtype = weight_.dtype = recipe.forward_dtype;
  grad_output_.dtype = recipe.backward_dtype;
  weight_.blocks = ops::Fp8BlockShape::block_128x128;  // Transformer Engine's w_block_scaling_dim 2
}

Fp8Linear::Casts Fp8Linear::quantize(Operand& op, const Tensor& t, Cast cast, Layout layout) {
  if (recipe_.scaling == ops::Fp8Scaling::blockwise) return quantize_blockwise(op, t, layout);
  ops::fp8_scaling_start(op, recipe_.amax_history_len, t.device());
  Tensor amax = op.amax_history.slice(0, 1);  // the current step's slot
  Tensor record;                              // where this cast's amax goes, if anywhere
  if (recipe_.scaling == ops::Fp8Scaling::current) {
    // The scale of this tensor: a pure function of it, so a backward cast again gives the same values.
    ops::fp8_amax(amax, t);
    ops::fp8_update_scale(op.scale, op.scale_inv, op.amax_history, op.dtype, recipe_);
  } else if (cast == Cast::record) {
    record = amax;
  }
  Casts codes;
  codes.rows.scale_inv = codes.transposed.scale_inv = op.scale_inv;
  if (layout != Layout::transposed) codes.rows.codes = Tensor::empty(t.shape(), op.dtype, t.device());
  if (layout == Layout::rows) {
    ops::fp8_quantize(codes.rows.codes, record, t, op.scale);
    return codes;
  }
  const int64_t features = t.dim(t.ndim() - 1), n = features == 0 ? 0 : t.numel() / features;
  codes.transposed.codes = Tensor::empty({features, n}, op.dtype, t.device());
  ops::fp8_quantize_transpose(codes.rows.codes, codes.transposed.codes, record, t.view({n, features}), op.scale);
  return codes;
}

Fp8Linear::Casts Fp8Linear::quantize_blockwise(const Operand& op, const Tensor& t, Layout layout) const {
  const int64_t features = t.dim(t.ndim() - 1), n = features == 0 ? 0 : t.numel() / features;
  const auto make = [&](int64_t rows, int64_t cols) {
    return Quantized{Tensor::empty({rows, cols}, op.dtype, t.device()),
                     Tensor::empty(ops::fp8_block_scale_shape(rows, cols, op.blocks), DType::f32, t.device())};
  };
  Casts codes;
  if (layout != Layout::transposed) codes.rows = make(n, features);
  if (layout != Layout::rows) codes.transposed = make(features, n);
  ops::fp8_quantize_blockwise(codes.rows.codes, codes.rows.scale_inv, codes.transposed.codes,
                              codes.transposed.scale_inv, t.view({n, features}), op.blocks);
  return codes;
}

const Fp8Linear::Quantized& Fp8Linear::weight_cast(const Tensor& weight, Layout layout) {
  if (dtype_is_fp8(weight.dtype())) {  // an FP8 parameter: already cast, with weight_'s scale
    MEGATRON_CHECK(weight.dtype() == weight_.dtype && recipe_.scaling != ops::Fp8Scaling::blockwise,
                   name_ << ": an FP8 weight of " << dtype_name(weight.dtype()) << " needs a per-tensor recipe that "
                         << "casts weights to it; this layer's casts them to " << dtype_name(weight_.dtype)
                         << (recipe_.scaling == ops::Fp8Scaling::blockwise ? " in 128x128 blocks" : ""));
    if (!weight_casts_.transposed.codes.defined()) {
      Tensor codes_t = Tensor::empty({weight.dim(1), weight.dim(0)}, weight.dtype(), weight.device());
      ops::transpose01(codes_t, weight);
      weight_casts_.rows = {weight, weight_.scale_inv};
      weight_casts_.transposed = {codes_t, weight_.scale_inv};
    }
  } else if (!weight_casts_.rows.codes.defined()) {
    // Both layouts from one read of the weight at its first use in the step, the forward's (which
    // records the weight's amax under the delayed recipe); the backward's W^T is then at hand.
    weight_casts_ = quantize(weight_, weight, Cast::record, Layout::both);
  }
  return layout == Layout::rows ? weight_casts_.rows : weight_casts_.transposed;
}

void Fp8Linear::gemm(Gemm which, Tensor& c, const Quantized& a, const Operand& a_op, const Quantized& b,
                     const Operand& b_op, float beta) const {
  ops::MatmulParams params{.trans_b = ops::Transpose::yes, .beta = beta};
  if (recipe_.scaling == ops::Fp8Scaling::blockwise)
    return ops::fp8_matmul_blockwise(c, a.codes, a.scale_inv, a_op.blocks, b.codes, b.scale_inv, b_op.blocks, params);
  params.fp8_fast_accumulation = which == Gemm::fprop;
  ops::fp8_matmul(c, a.codes, a.scale_inv, b.codes, b.scale_inv, params);
}

const Tensor& Fp8Linear::ones_column(const Tensor& t) {
  const int64_t n = t.dim(0);
  if (!ones_.defined() || ones_.dim(0) != n || ones_.dtype() != t.dtype() || ones_.device() != t.device()) {
    Tensor host = Tensor::empty({n, 1}, t.dtype());
    host.fill(1.0);
    ones_ = host.to(t.device());
  }
  return ones_;
}

Fp8Linear::Casts Fp8Linear::fused_cast(Operand& op, int64_t rows, int64_t features, Device device,
                                       const FusedCast& cast) {
  MEGATRON_CHECK(fuses_casts(), name_ << ": a cast fused into its producer needs the delayed recipe's scale, known "
                                         "before the tensor; this layer's recipe takes the scale from the tensor");
  ops::fp8_scaling_start(op, recipe_.amax_history_len, device);
  Casts casts;
  casts.rows = {Tensor::empty({rows, features}, op.dtype, device), op.scale_inv};
  casts.transposed = {Tensor::empty({features, rows}, op.dtype, device), op.scale_inv};
  Tensor amax = op.amax_history.slice(0, 1);  // the current step's slot, as quantize's Cast::record
  cast(casts.rows.codes, casts.transposed.codes, amax, op.scale);
  return casts;
}

Fp8Linear::Casts Fp8Linear::cast_input(int64_t rows, int64_t features, Device device, const FusedCast& cast) {
  return fused_cast(input_, rows, features, device, cast);
}

Fp8Linear::Casts Fp8Linear::cast_grad_output(int64_t rows, int64_t features, Device device, const FusedCast& cast) {
  return fused_cast(grad_output_, rows, features, device, cast);
}

void Fp8Linear::linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias, Quantized* x_t) {
  const Casts xq = quantize(input_, x, Cast::record, x_t != nullptr ? Layout::both : Layout::rows);
  if (x_t != nullptr) {
    *x_t = xq.transposed;
    // Current scaling rewrites the operand's scale_inv at its next cast (another micro-batch's
    // forward may run before this one's backward): the kept cast keeps its own.
    if (recipe_.scaling == ops::Fp8Scaling::current) x_t->scale_inv = xq.transposed.scale_inv.clone();
  }
  linear_forward(y, xq, weight, bias);
}

void Fp8Linear::linear_forward(Tensor& y, const Casts& x, const Tensor& weight, const Tensor& bias) {
  const Quantized& wq = weight_cast(weight, Layout::rows);
  // y (N,out) = x (N,in) W (out,in)^T: already the TN form FP8 tensor cores take.
  gemm(Gemm::fprop, y, x.rows, input_, wq, weight_, 0.0f);
  if (bias.defined()) ops::matmul(y, ones_column(y), bias.view({1, -1}), {.beta = 1.0f});
}

void Fp8Linear::linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    Quantized* x_t) {
  linear_forward(pre, x, weight, bias, x_t);
  ops::gelu_forward(y, pre);
}

void Fp8Linear::linear_backward(Tensor& dx, Tensor& dweight, const Casts& dy, const Tensor& x, const Tensor& weight,
                                ops::GradWrite dweight_write, const Quantized* x_t) {
  if (dx.defined()) {
    // dx (N,in) = dy (N,out) W (out,in), W given as the rows of W^T (in,out): the TN form.
    const Quantized& wq_t = weight_cast(weight, Layout::transposed);
    gemm(Gemm::dgrad, dx, dy.rows, grad_output_, wq_t, weight_, 0.0f);
  }
  if (!dweight.defined()) return;
  // dW (out,in) += dy^T (out,N) x (N,in) into the fp32 main grad (or =), from the rows of dy^T and x^T.
  const Quantized xq_t = x_t != nullptr ? *x_t : quantize(input_, x, Cast::again, Layout::transposed).transposed;
  gemm(Gemm::wgrad, dweight, dy.transposed, grad_output_, xq_t, input_,
       dweight_write == ops::GradWrite::overwrite ? 0.0f : 1.0f);
}

void Fp8Linear::linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                const Tensor& weight, ops::GradWrite dweight_write, const Quantized* x_t) {
  const Layout dy_layout = !dweight.defined() ? Layout::rows : dx.defined() ? Layout::both : Layout::transposed;
  linear_backward(dx, dweight, quantize(grad_output_, dy, Cast::record, dy_layout), x, weight, dweight_write, x_t);
  if (dweight.defined() && dbias.defined()) {  // db += dy^T 1 (bf16 dy)
    Tensor db = dbias.view({-1, 1});
    ops::matmul(db, dy, ones_column(dy), {.trans_a = ops::Transpose::yes, .beta = 1.0f});
  }
}

void Fp8Linear::gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                     const Tensor& weight, const Tensor& pre, ops::GradWrite dweight_write,
                                     const Quantized* x_t) {
  Tensor dact = Tensor::empty(dpre.shape(), dpre.dtype(), dpre.device());
  linear_backward(dact, dweight, dbias, dy, x, weight, dweight_write, x_t);
  ops::gelu_backward(dpre, dact, pre);
}

void Fp8Linear::reduce_amaxes() {
  std::vector<Tensor> slots;  // each used operand's amax of this step, history[0]
  for (Operand* op : {&input_, &weight_, &grad_output_})
    if (op->scale.defined()) slots.push_back(op->amax_history.slice(0, 1));
  for (const std::shared_ptr<Communicator>& group : amax_groups_)
    if (group && group->size() > 1 && !slots.empty()) group->all_reduce_coalesced(slots, ReduceOp::max);
}

void Fp8Linear::update_scales() { update_fp8_scales({this}); }

void update_fp8_scales(const std::vector<Fp8Linear*>& layers) {
  std::vector<Tensor> scales, scale_invs, histories;
  std::vector<DType> dtypes;
  for (Fp8Linear* layer : layers) {
    layer->weight_casts_ = Fp8Linear::Casts{};  // the optimizer changes the weights next
    if (layer->recipe_.scaling != ops::Fp8Scaling::delayed) continue;
    const ops::Fp8Recipe& first = layers.front()->recipe_;
    MEGATRON_CHECK(layer->recipe_.amax_history_len == first.amax_history_len &&
                       layer->recipe_.amax_compute_algo == first.amax_compute_algo &&
                       layer->recipe_.margin == first.margin,
                   "update_fp8_scales: " << layer->name_ << "'s delayed recipe differs from " << layers.front()->name_
                                         << "'s; update them apart");
    layer->reduce_amaxes();
    for (Fp8Linear::Operand* op : {&layer->input_, &layer->weight_, &layer->grad_output_}) {
      if (!op->scale.defined()) continue;
      scales.push_back(op->scale);
      scale_invs.push_back(op->scale_inv);
      histories.push_back(op->amax_history);
      dtypes.push_back(op->dtype);
    }
  }
  if (!scales.empty()) ops::fp8_update_scales(scales, scale_invs, histories, dtypes, layers.front()->recipe_);
}

Fp8Linear::RecipeState Fp8Linear::recipe_state() const {
  const int64_t len = recipe_.amax_history_len;
  // The operands' scales side by side (n), their histories as the columns of (len, n).
  const auto pack = [len](std::initializer_list<const Operand*> operands, Tensor& scale, Tensor& history) {
    const auto n = int64_t(operands.size());
    scale = Tensor::empty({n}, DType::f32);
    history = Tensor::zeros({len, n}, DType::f32);
    int64_t column = 0;
    for (const Operand* op : operands) {
      scale.data<float>()[column] = 1.0f;  // not cast yet: the starting state
      if (op->scale.defined()) {
        const Tensor s = op->scale.to(Device::cpu()), h = op->amax_history.to(Device::cpu());
        scale.data<float>()[column] = s.data<float>()[0];
        for (int64_t row = 0; row < len; ++row) history.data<float>()[row * n + column] = h.data<float>()[row];
      }
      ++column;
    }
  };
  RecipeState state;
  pack({&input_, &weight_}, state.scale_fwd, state.amax_history_fwd);
  pack({&grad_output_}, state.scale_bwd, state.amax_history_bwd);
  return state;
}

void Fp8Linear::load_recipe_state(const RecipeState& state, Device device) {
  weight_casts_ = Casts{};  // cast with the loaded scale from now on
  const int64_t len = recipe_.amax_history_len;
  const auto unpack = [&](std::initializer_list<Operand*> operands, const Tensor& scale, const Tensor& history,
                          const char* direction) {
    const auto n = int64_t(operands.size());
    MEGATRON_CHECK(scale.shape() == Shape{n} && history.ndim() == 2 && history.dim(0) >= 1 && history.dim(1) == n,
                   name_ << ": the FP8 recipe state of the " << direction << " tensors has scales "
                         << shape_str(scale.shape()) << " and amax history " << shape_str(history.shape())
                         << ", expected [" << n << "] and [history length, " << n << "]");
    const Tensor s_host = scale.to(DType::f32), h_host = history.to(DType::f32);
    const int64_t kept = std::min(len, history.dim(0));
    int64_t column = 0;
    for (Operand* op : operands) {
      Tensor s = Tensor::empty({1}, DType::f32), s_inv = Tensor::empty({1}, DType::f32);
      Tensor h = Tensor::zeros({len}, DType::f32);
      s.data<float>()[0] = s_host.data<float>()[column];
      s_inv.data<float>()[0] = 1.0f / s.data<float>()[0];  // as ops::fp8_update_scale sets it
      for (int64_t row = 0; row < kept; ++row) h.data<float>()[row] = h_host.data<float>()[row * n + column];
      op->scale = s.to(device);
      op->scale_inv = s_inv.to(device);
      op->amax_history = h.to(device);
      ++column;
    }
  };
  unpack({&input_, &weight_}, state.scale_fwd, state.amax_history_fwd, "forward");
  unpack({&grad_output_}, state.scale_bwd, state.amax_history_bwd, "backward");
}

}  // namespace megatron::tensor_parallel
