#include "megatron/transformer/norm.h"

namespace megatron {

namespace {
Tensor rows(const Tensor& t) { return t.view({-1, t.dim(-1)}); }
DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace

Norm::Norm(ParameterRegistry& registry, const TransformerConfig& config, int tp_rank, const std::string& weight_name,
           const std::string& bias_name) {
  const bool layernorm = config.normalization == Normalization::LayerNorm;
  params_ = {layernorm ? ops::NormKind::layernorm : ops::NormKind::rmsnorm, config.layernorm_epsilon};
  const int tp = int(config.tensor_model_parallel_size);
  weight_ = registry.add({.name = weight_name,
                          .global_shape = {config.hidden_size},
                          .init = InitMethod::ones,
                          .weight_decay = false,
                          .sequence_parallel = config.sequence_parallel},
                         tp_rank, tp);
  if (layernorm)
    bias_ = registry.add({.name = bias_name,
                          .global_shape = {config.hidden_size},
                          .init = InitMethod::zeros,
                          .weight_decay = false,
                          .sequence_parallel = config.sequence_parallel},
                         tp_rank, tp);
}

Tensor Norm::forward(const Tensor& x, Saved& saved) const {
  const int64_t n = x.numel() / x.dim(-1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  saved.input = x;
  saved.rstd = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  saved.mean = bias_ ? Tensor::empty({n}, stats_dtype(x.dtype()), x.device()) : Tensor();
  Tensor y2 = rows(y);
  ops::norm_forward(y2, saved.mean, saved.rstd, rows(x), weight_->data, bias_ ? bias_->data : Tensor(), params_);
  return y;
}

Tensor Norm::backward(const Tensor& dy, const Saved& saved) const {
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor dx2 = rows(dx);
  Tensor dbias = bias_ ? bias_->main_grad : Tensor();
  ops::norm_backward(dx2, weight_->main_grad, dbias, rows(dy), rows(saved.input), weight_->data, saved.mean, saved.rstd,
                     params_);
  return dx;
}

}  // namespace megatron
