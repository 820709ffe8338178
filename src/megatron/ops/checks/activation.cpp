#include "megatron/ops/checks/activation.h"

#include "megatron/ops/checks/fp8.h"

namespace megatron::ops::checks {
namespace {

void check_like(const Tensor& t, const Tensor& x, const Shape& shape, const char* name, TensorCheck device) {
  device(t, name);
  check_shape(t, shape, name);
  check_dtype(t, x.dtype(), name);
}

// SwiGLU shapes: x (..., 2F) and y (..., F).
SwigluDims swiglu_dims(const Tensor& x, TensorCheck device) {
  check_defined(x, "swiglu x");
  MEGATRON_CHECK(x.ndim() >= 1 && x.dim(-1) % 2 == 0,
                 "swiglu x must end in 2F = [gate | up] channels, got shape " << shape_str(x.shape()));
  const SwigluDims dims{rows_of(x, "swiglu x"), x.dim(-1) / 2};
  device(x, "swiglu x");
  return dims;
}

}  // namespace

void check_gelu_forward(const Tensor& y, const Tensor& x, TensorCheck device) {
  check_defined(x, "gelu x");
  device(x, "gelu x");
  check_like(y, x, x.shape(), "gelu y", device);
}

void check_gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, TensorCheck device) {
  check_defined(x, "gelu x");
  device(x, "gelu x");
  check_like(dy, x, x.shape(), "gelu dy", device);
  check_like(dx, x, x.shape(), "gelu dx", device);
}

SwigluDims check_swiglu_forward(const Tensor& y, const Tensor& x, TensorCheck device) {
  const SwigluDims dims = swiglu_dims(x, device);
  check_like(y, x, with_last_dim(x.shape(), dims.features), "swiglu y", device);
  return dims;
}

SwigluDims check_swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, TensorCheck device) {
  const SwigluDims dims = swiglu_dims(x, device);
  check_like(dy, x, with_last_dim(x.shape(), dims.features), "swiglu dy", device);
  check_like(dx, x, x.shape(), "swiglu dx", device);
  return dims;
}

SwigluDims check_swiglu_forward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                    const Tensor& scale, TensorCheck device) {
  const SwigluDims dims = swiglu_dims(x, device);
  check_fp8_casts(q, q_t, amax, scale, dims.rows, dims.features, "swiglu_forward_fp8", device);
  return dims;
}

SwigluDims check_swiglu_backward_fp8(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& dy,
                                     const Tensor& x, const Tensor& scale, TensorCheck device) {
  const SwigluDims dims = swiglu_dims(x, device);
  check_like(dy, x, with_last_dim(x.shape(), dims.features), "swiglu dy", device);
  check_fp8_casts(q, q_t, amax, scale, dims.rows, 2 * dims.features, "swiglu_backward_fp8", device);
  return dims;
}

}  // namespace megatron::ops::checks
