#include "megatron/transformer/norm.h"

namespace megatron {

namespace {
Tensor rows(const Tensor& t) { return t.view({-1, t.dim(-1)}); }
DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }
}  // namespace

Norm::Norm(ParameterRegistry& registry, const TransformerConfig& config, const std::string& weight_name,
           const std::string& bias_name, const Rows& rows) {
  const bool layernorm = config.normalization == Normalization::LayerNorm;
  params_ = {layernorm ? ops::NormKind::layernorm : ops::NormKind::rmsnorm, config.layernorm_epsilon};
  weight_ = registry.add({.name = weight_name,
                          .global_shape = {rows.width},
                          .init = InitMethod::ones,
                          .weight_decay = false,
                          .sequence_parallel = rows.partial_over_tp});
  if (layernorm)
    bias_ = registry.add({.name = bias_name,
                          .global_shape = {rows.width},
                          .init = InitMethod::zeros,
                          .weight_decay = false,
                          .sequence_parallel = rows.partial_over_tp});
}

// y2 (rows) = norm(x), or only the statistics where y2 is undefined; saved as forward's.
void Norm::normalize(const ResidualStream& x, Tensor& y2, Saved& saved) const {
  const Tensor& r = x.residual;
  const int64_t n = r.numel() / r.dim(-1);
  saved.rstd = Tensor::empty({n}, stats_dtype(r.dtype()), r.device());
  saved.mean = bias_ ? Tensor::empty({n}, stats_dtype(r.dtype()), r.device()) : Tensor();
  const Tensor bias = bias_ ? bias_->data : Tensor();
  if (x.delta.defined()) {
    saved.input = Tensor::empty(r.shape(), r.dtype(), r.device());
    Tensor h2 = rows(saved.input);
    ops::add_norm_forward(h2, y2, saved.mean, saved.rstd, rows(r), rows(x.delta), weight_->data, bias, params_);
  } else {
    saved.input = r;
    ops::norm_forward(y2, saved.mean, saved.rstd, rows(r), weight_->data, bias, params_);
  }
}

Tensor Norm::forward(const ResidualStream& x, Saved& saved) const {
  Tensor y = Tensor::empty(x.residual.shape(), x.residual.dtype(), x.residual.device());
  Tensor y2 = rows(y);
  normalize(x, y2, saved);
  return y;
}

tensor_parallel::Fp8Activation Norm::forward(const ResidualStream& x, Saved& saved,
                                             tensor_parallel::Fp8Linear& consumer) const {
  Tensor statistics_only;
  normalize(x, statistics_only, saved);
  const Tensor h2 = rows(saved.input), bias = bias_ ? bias_->data : Tensor();
  return {saved.input.shape(), saved.input.dtype(),
          consumer.cast_input(
              h2.dim(0), h2.dim(1), h2.device(), [&](Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale) {
                ops::norm_forward_fp8(q, q_t, amax, h2, weight_->data, bias, saved.mean, saved.rstd, params_, scale);
              })};
}

Tensor Norm::recompute(const Saved& saved) const {
  Saved again;
  return forward(ResidualStream{saved.input, Tensor()}, again);
}

Tensor Norm::backward(const Tensor& dy, const Saved& saved, const Tensor& dresidual) const {
  Tensor dx = Tensor::empty(saved.input.shape(), saved.input.dtype(), saved.input.device());
  Tensor dx2 = rows(dx);
  Tensor dbias = bias_ ? bias_->main_grad : Tensor();
  if (dresidual.defined()) {
    ops::add_norm_backward(dx2, weight_->main_grad, dbias, rows(dy), rows(dresidual), rows(saved.input), weight_->data,
                           saved.mean, saved.rstd, params_);
  } else {
    ops::norm_backward(dx2, weight_->main_grad, dbias, rows(dy), rows(saved.input), weight_->data, saved.mean,
                       saved.rstd, params_);
  }
  return dx;
}

}  // namespace megatron
