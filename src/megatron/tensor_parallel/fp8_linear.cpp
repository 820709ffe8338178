#include "megatron/tensor_parallel/fp8_linear.h"

#include <utility>

#include "megatron/ops/activation.h"
#include "megatron/ops/gemm.h"

namespace megatron::tensor_parallel {

namespace {
// A fresh operand on `device`: scale 1 (Transformer Engine's start) and an empty history.
Tensor one_on(Device device) {
  Tensor one = Tensor::empty({1}, DType::f32);
  one.fill(1.0);
  return one.to(device);  // a CPU tensor stays itself: each call makes its own
}
void initialize(Fp8Linear::Operand& op, int64_t history_len, Device device) {
  op.scale = one_on(device);
  op.scale_inv = one_on(device);
  op.amax_history = Tensor::zeros({history_len}, DType::f32, device);
}
}  // namespace

Fp8Linear::Fp8Linear(const ops::Fp8Recipe& recipe, std::vector<std::shared_ptr<Communicator>> amax_groups)
    : recipe_(recipe), amax_groups_(std::move(amax_groups)) {
  input_.dtype = weight_.dtype = recipe.forward_dtype;
  grad_output_.dtype = recipe.backward_dtype;
}

Tensor Fp8Linear::quantize(Operand& op, const Tensor& t, Cast cast) {
  if (!op.scale.defined()) initialize(op, recipe_.amax_history_len, t.device());
  Tensor q = Tensor::empty(t.shape(), op.dtype, t.device());
  Tensor amax = op.amax_history.slice(0, 1);  // the current step's slot
  if (recipe_.scaling == ops::Fp8Scaling::current) {
    // The scale of this tensor: a pure function of it, so a backward cast again gives the same values.
    ops::fp8_amax(amax, t);
    ops::fp8_update_scale(op.scale, op.scale_inv, op.amax_history, op.dtype, recipe_);
    Tensor no_amax;
    ops::fp8_quantize(q, no_amax, t, op.scale);
  } else {
    Tensor record = cast == Cast::record ? amax : Tensor();
    ops::fp8_quantize(q, record, t, op.scale);
  }
  return q;
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

void Fp8Linear::linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor xq = quantize(input_, x, Cast::record), wq = quantize(weight_, weight, Cast::record);
  // y (N,out) = x (N,in) W (out,in)^T: already the TN form FP8 tensor cores take.
  ops::fp8_matmul(y, xq, input_.scale_inv, wq, weight_.scale_inv, {.trans_b = ops::Transpose::yes});
  if (bias.defined()) ops::matmul(y, ones_column(x), bias.view({1, -1}), {.beta = 1.0f});
}

void Fp8Linear::linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  linear_forward(pre, x, weight, bias);
  ops::gelu_forward(y, pre);
}

void Fp8Linear::linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                const Tensor& weight) {
  const Tensor dyq = quantize(grad_output_, dy, Cast::record);
  if (dx.defined()) {
    // dx (N,in) = dy (N,out) W (out,in)
    const Tensor wq = quantize(weight_, weight, Cast::again);
    ops::fp8_matmul(dx, dyq, grad_output_.scale_inv, wq, weight_.scale_inv, {});
  }
  if (!dweight.defined()) return;
  // dW (out,in) += dy^T (out,N) x (N,in), into the fp32 main grad; db += dy^T 1 (bf16 dy)
  const Tensor xq = quantize(input_, x, Cast::again);
  ops::fp8_matmul(dweight, dyq, grad_output_.scale_inv, xq, input_.scale_inv,
                  {.trans_a = ops::Transpose::yes, .beta = 1.0f});
  if (dbias.defined()) {
    Tensor db = dbias.view({-1, 1});
    ops::matmul(db, dy, ones_column(dy), {.trans_a = ops::Transpose::yes, .beta = 1.0f});
  }
}

void Fp8Linear::gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                                     const Tensor& weight, const Tensor& pre) {
  Tensor dact = Tensor::empty(dpre.shape(), dpre.dtype(), dpre.device());
  linear_backward(dact, dweight, dbias, dy, x, weight);
  ops::gelu_backward(dpre, dact, pre);
}

void Fp8Linear::update_scales() {
  if (recipe_.scaling != ops::Fp8Scaling::delayed) return;
  std::vector<Operand*> used;
  std::vector<Tensor> slots;  // each used operand's amax of this step, history[0]
  for (Operand* op : {&input_, &weight_, &grad_output_}) {
    if (!op->scale.defined()) continue;
    used.push_back(op);
    slots.push_back(op->amax_history.slice(0, 1));
  }
  for (const std::shared_ptr<Communicator>& group : amax_groups_)
    if (group && group->size() > 1 && !slots.empty()) group->all_reduce_coalesced(slots, ReduceOp::max);
  for (Operand* op : used) ops::fp8_update_scale(op->scale, op->scale_inv, op->amax_history, op->dtype, recipe_);
}

}  // namespace megatron::tensor_parallel
