#include "megatron/transformer/mlp.h"

#include <cmath>

#include "megatron/ops/activation.h"

namespace megatron {

MLP::MLP(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
         const std::string& prefix, const std::optional<ops::Fp8Recipe>& fp8)
    : swiglu_(config.swiglu),
      recompute_(config.recompute.recomputes("mlp")),
      linear_fc1_(registry, ctx, prefix + ".linear_fc1", config.hidden_size,
                  config.ffn_hidden_size * (config.swiglu ? 2 : 1),
                  {.bias = config.add_bias_linear,
                   .init_std = config.init_method_std,
                   .partition_blocks = config.swiglu ? 2 : 1,
                   .fp8 = fp8,
                   .fp8_param = fp8 && config.fp8.fp8_param_gather}),
      linear_fc2_(registry, ctx, prefix + ".linear_fc2", config.ffn_hidden_size, config.hidden_size,
                  {.bias = config.add_bias_linear,
                   .init_std = config.init_method_std / std::sqrt(2.0f * float(config.num_layers)),
                   .fp8 = fp8,
                   .fp8_param = fp8 && config.fp8.fp8_param_gather}) {}

std::vector<tensor_parallel::Fp8Linear*> MLP::fp8_linears() const {
  std::vector<tensor_parallel::Fp8Linear*> layers;
  for (tensor_parallel::Fp8Linear* fp8 : {linear_fc1_.fp8(), linear_fc2_.fp8()})
    if (fp8 != nullptr) layers.push_back(fp8);
  return layers;
}

void MLP::Saved::count(ActivationMemory& m) const {
  fc1.count(m);
  fc2.count(m);
  m.add(fc1_out);
}

// act = activation(fc1_out), (S,B,F).
Tensor MLP::activation(const Tensor& fc1_out) const {
  const int64_t F = fc1_out.dim(-1) / (swiglu_ ? 2 : 1);
  Tensor act = Tensor::empty({fc1_out.dim(0), fc1_out.dim(1), F}, fc1_out.dtype(), fc1_out.device());
  Tensor act_rows = act.view({-1, F});
  const Tensor fc1_rows = fc1_out.view({act_rows.dim(0), -1});
  if (swiglu_)
    ops::swiglu_forward(act_rows, fc1_rows);
  else
    ops::gelu_forward(act_rows, fc1_rows);
  return act;
}

Tensor MLP::fc1_and_activation(const Tensor& x, tensor_parallel::LinearSaved& fc1, Tensor& fc1_out) const {
  if (!swiglu_) return linear_fc1_.forward(x, fc1, &fc1_out);
  fc1_out = linear_fc1_.forward(x, fc1);
  return activation(fc1_out);
}

// An FP8 fc2 under the delayed recipe takes SwiGLU's output as the FP8 casts SwiGLU's kernel
// writes: the activation is never stored in bf16, and its x^T cast is kept for fc2's backward.
bool MLP::fuses_fp8_activation() const { return swiglu_ && !recompute_ && linear_fc2_.takes_fp8_input(); }

Tensor MLP::fc2_of_fp8_swiglu(const Tensor& fc1_out, Saved& saved) const {
  saved.fc1_out = fc1_out;
  const Tensor fc1_rows = fc1_out.view({-1, fc1_out.dim(-1)});
  const int64_t F = fc1_rows.dim(1) / 2;
  const tensor_parallel::Fp8Activation act{
      {fc1_out.dim(0), fc1_out.dim(1), F},
      fc1_out.dtype(),
      linear_fc2_.fp8()->cast_input(fc1_rows.dim(0), F, fc1_out.device(),
                                    [&](Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale) {
                                      ops::swiglu_forward_fp8(q, q_t, amax, fc1_rows, scale);
                                    })};
  return linear_fc2_.forward(act, saved.fc2);
}

Tensor MLP::forward(const tensor_parallel::Fp8Activation& x, Saved& saved) const {
  MEGATRON_CHECK(input_fp8() != nullptr, "MLP: an FP8-cast input needs SwiGLU's FP8 path and an FP8 fc1 that takes it");
  return fc2_of_fp8_swiglu(linear_fc1_.forward(x, saved.fc1), saved);
}

Tensor MLP::forward(const Tensor& x, Saved& saved) const {
  if (fuses_fp8_activation()) {
    const Tensor y = fc2_of_fp8_swiglu(linear_fc1_.forward(x, saved.fc1), saved);
    if (saved.fc1.input_t.codes.defined()) saved.fc1.input = Tensor();  // backward reads its cast
    return y;
  }
  Tensor y = linear_fc2_.forward(fc1_and_activation(x, saved.fc1, saved.fc1_out), saved.fc2);
  // fc2's input (the activation) is not kept: backward reads the FP8 cast of it the forward kept,
  // or recomputes it from fc1_out (one elementwise pass instead of an (S,B,F) tensor per layer
  // alive until backward).
  saved.fc2.input = Tensor();
  if (recompute_) {
    // Only fc1's input is kept: backward runs fc1 again (and makes its casts again).
    saved.fc1_out = Tensor();
    saved.fc1.input_t = saved.fc2.input_t = {};
  } else if (saved.fc1.input_t.codes.defined()) {
    saved.fc1.input = Tensor();
  }
  return y;
}

Tensor MLP::backward(const Tensor& dy, const Saved& saved) const {
  tensor_parallel::LinearSaved fc1 = saved.fc1, fc2 = saved.fc2;
  Tensor fc1_out = saved.fc1_out;
  if (recompute_)
    fc2.input = fc1_and_activation(saved.fc1.input, fc1, fc1_out);  // fc1's forward again, on the same input
  else if (!fc2.input_t.codes.defined())
    fc2.input = activation(fc1_out);
  if (!swiglu_) {
    const Tensor dfc1 = linear_fc2_.backward(dy, fc2, fc1_out);  // the GELU's backward fused in
    fc2 = {};
    return linear_fc1_.backward(dfc1, fc1);
  }
  const Tensor dact = linear_fc2_.backward(dy, fc2);
  fc2 = {};
  const Tensor fc1_rows = fc1_out.view({-1, fc1_out.dim(-1)});
  const Tensor dact_rows = dact.view({fc1_rows.dim(0), -1});
  if (linear_fc1_.takes_fp8_grad_output()) {
    // SwiGLU's backward writes fc1's output gradient as the FP8 casts fc1's backward reads.
    const tensor_parallel::Fp8Activation dfc1{
        fc1_out.shape(), fc1_out.dtype(),
        linear_fc1_.fp8()->cast_grad_output(fc1_rows.dim(0), fc1_rows.dim(1), dy.device(),
                                            [&](Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale) {
                                              ops::swiglu_backward_fp8(q, q_t, amax, dact_rows, fc1_rows, scale);
                                            })};
    return linear_fc1_.backward(dfc1, fc1);
  }
  Tensor dfc1 = Tensor::empty(fc1_out.shape(), fc1_out.dtype(), fc1_out.device());
  Tensor dfc1_rows = dfc1.view(fc1_rows.shape());
  ops::swiglu_backward(dfc1_rows, dact_rows, fc1_rows);
  return linear_fc1_.backward(dfc1, fc1);
}

}  // namespace megatron
