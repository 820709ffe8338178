#include "megatron/ops/checks/norm.h"

#include <utility>

#include "megatron/ops/checks/fp8.h"

namespace megatron::ops::checks {
namespace {

void check_param(const Tensor& t, int64_t C, DType dtype, const char* name, TensorCheck device) {
  device(t, name);
  check_shape(t, {C}, name);
  check_dtype(t, dtype, name);
}

// The mean is saved for LayerNorm only; RMSNorm takes no mean and no bias.
// t has x's device, shape and dtype.
void check_like_x(const Tensor& t, const Tensor& x, const char* name, TensorCheck device) {
  device(t, name);
  check_shape(t, x.shape(), name);
  check_dtype(t, x.dtype(), name);
}

void check_kind_tensors(const NormParams& p, const Tensor& mean, const Tensor& bias, const char* bias_name) {
  if (p.kind == NormKind::rmsnorm) {
    MEGATRON_CHECK(!mean.defined(), "RMSNorm saves no mean; pass an undefined mean tensor");
    MEGATRON_CHECK(!bias.defined(), "RMSNorm has no bias; pass an undefined " << bias_name);
  } else {
    check_defined(mean, "LayerNorm mean");
  }
}

}  // namespace

NormDims check_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& weight, const Tensor& bias, const NormParams& params,
                            const NormBackend& backend) {
  const int64_t N = rows_of(x, "norm x"), C = x.dim(-1);
  backend.device(x, "norm x");
  check_kind_tensors(params, mean, bias, "bias");
  MEGATRON_CHECK(params.eps > 0.0f, "norm eps must be positive, got " << params.eps);
  backend.x_dtype(x, "norm_forward");
  const DType stat = accum_dtype(x.dtype());
  if (y.defined()) {  // undefined: the statistics only
    backend.device(y, "norm y");
    check_shape(y, x.shape(), "norm y");
    check_dtype(y, x.dtype(), "norm y");
  }
  check_param(weight, C, x.dtype(), "norm weight", backend.device);
  if (bias.defined()) check_param(bias, C, x.dtype(), "norm bias", backend.device);
  if (mean.defined()) check_param(mean, N, stat, "norm mean", backend.device);
  check_param(rstd, N, stat, "norm rstd", backend.device);
  return {N, C};
}

NormDims check_norm_forward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& rstd,
                                const NormParams& params, const Tensor& scale, const NormBackend& backend) {
  const NormDims dims = check_norm_forward(Tensor(), mean, rstd, x, weight, bias, params, backend);
  check_fp8_casts(q, q_t, amax, scale, dims.rows, dims.channels, "norm_forward_fp8", backend.device);
  return dims;
}

NormDims check_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                             const NormParams& params, const NormBackend& backend) {
  const int64_t N = rows_of(x, "norm x"), C = x.dim(-1);
  backend.device(x, "norm x");
  check_kind_tensors(params, mean, dbias, "dbias");
  backend.x_dtype(x, "norm_backward");
  const DType acc = accum_dtype(x.dtype());
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&dx, "norm dx"}, {&dy, "norm dy"}}) {
    backend.device(*t, name);
    check_shape(*t, x.shape(), name);
    check_dtype(*t, x.dtype(), name);
  }
  check_param(weight, C, x.dtype(), "norm weight", backend.device);
  check_param(dweight, C, acc, "norm dweight", backend.device);
  if (dbias.defined()) check_param(dbias, C, acc, "norm dbias", backend.device);
  if (mean.defined()) check_param(mean, N, acc, "norm mean", backend.device);
  check_param(rstd, N, acc, "norm rstd", backend.device);
  return {N, C};
}

NormDims check_add_norm_forward(const Tensor& h, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                const NormParams& params, const NormBackend& backend) {
  const NormDims dims = check_norm_forward(y, mean, rstd, x, weight, bias, params, backend);
  check_like_x(residual, x, "norm residual", backend.device);
  check_like_x(h, x, "norm h", backend.device);
  return dims;
}

NormDims check_add_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                 const Tensor& dh, const Tensor& h, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const NormParams& params, const NormBackend& backend) {
  const NormDims dims = check_norm_backward(dx, dweight, dbias, dy, h, weight, mean, rstd, params, backend);
  check_like_x(dh, h, "norm dh", backend.device);
  return dims;
}

}  // namespace megatron::ops::checks
