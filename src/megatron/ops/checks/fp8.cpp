#include "megatron/ops/checks/fp8.h"

#include <utility>

namespace megatron::ops::checks {
namespace {

void check_scalar_f32(const Tensor& t, const char* name, TensorCheck device) {
  check_numel(t, 1, name);
  device(t, name);
  check_dtype(t, DType::f32, name);
}

}  // namespace

bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }

void check_fp8_amax(const Tensor& amax, const Tensor& x, TensorCheck device, TensorCheck x_dtype) {
  check_scalar_f32(amax, "fp8 amax", device);
  check_defined(x, "fp8 x");
  device(x, "fp8 x");
  x_dtype(x, "fp8 x");
}

void check_fp8_quantize(const Tensor& q, const Tensor& amax, const Tensor& x, const Tensor& scale, TensorCheck device,
                        TensorCheck x_dtype) {
  if (amax.defined()) check_scalar_f32(amax, "fp8_quantize amax", device);
  check_scalar_f32(scale, "fp8_quantize scale", device);
  check_defined(x, "fp8_quantize x");
  device(x, "fp8_quantize x");
  x_dtype(x, "fp8_quantize x");
  check_defined(q, "fp8_quantize q");
  device(q, "fp8_quantize q");
  MEGATRON_CHECK(is_fp8(q.dtype()), "fp8_quantize q has dtype " << dtype_name(q.dtype()) << "; expected e4m3 or e5m2");
  check_shape(q, x.shape(), "fp8_quantize q");
}

void check_fp8_quantize_transpose(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                  const Tensor& scale, TensorCheck device, TensorCheck x_dtype) {
  check_defined(x, "fp8_quantize_transpose x");
  MEGATRON_CHECK(x.ndim() == 2, "fp8_quantize_transpose x has shape " << shape_str(x.shape()) << "; expected 2-D");
  check_defined(q_t, "fp8_quantize_transpose q_t");
  check_fp8_quantize(q_t, amax, x.view({x.dim(1), x.dim(0)}), scale, device, x_dtype);
  if (!q.defined()) return;
  check_fp8_quantize(q, amax, x, scale, device, x_dtype);
  check_dtype(q, q_t.dtype(), "fp8_quantize_transpose q");
}

void check_fp8_update_scale(const Tensor& scale, const Tensor& scale_inv, const Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe, TensorCheck device) {
  check_scalar_f32(scale, "fp8_update_scale scale", device);
  check_scalar_f32(scale_inv, "fp8_update_scale scale_inv", device);
  check_numel(amax_history, recipe.amax_history_len, "fp8_update_scale amax_history");
  device(amax_history, "fp8_update_scale amax_history");
  check_dtype(amax_history, DType::f32, "fp8_update_scale amax_history");
  MEGATRON_CHECK(is_fp8(fp8_dtype), "fp8_update_scale: " << dtype_name(fp8_dtype) << " is not e4m3 or e5m2");
  MEGATRON_CHECK(recipe.margin >= 0 && recipe.margin < 127,
                 "fp8_update_scale: margin " << recipe.margin << " must lie in [0, 127)");
}

MatmulDims check_fp8_matmul(const Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                            const Tensor& b_scale_inv, const MatmulParams& params, TensorCheck device) {
  for (const auto& [t, name] : {std::pair{&a, "fp8_matmul A"}, std::pair{&b, "fp8_matmul B"}}) {
    check_defined(*t, name);
    device(*t, name);
    MEGATRON_CHECK(is_fp8(t->dtype()), name << " has dtype " << dtype_name(t->dtype()) << "; expected e4m3 or e5m2");
  }
  MEGATRON_CHECK(!(a.dtype() == DType::e5m2 && b.dtype() == DType::e5m2),
                 "fp8_matmul: A and B are both e5m2, which FP8 tensor cores do not multiply; quantise one to e4m3");
  check_scalar_f32(a_scale_inv, "fp8_matmul A scale_inv", device);
  check_scalar_f32(b_scale_inv, "fp8_matmul B scale_inv", device);
  check_defined(c, "fp8_matmul C");
  device(c, "fp8_matmul C");
  MEGATRON_CHECK(c.dtype() == DType::bf16 || c.dtype() == DType::f16 || c.dtype() == DType::f32,
                 "fp8_matmul C has dtype " << dtype_name(c.dtype()) << "; expected bf16, f16 or f32");
  return check_matmul_dims(c, a, b, params, "fp8_matmul");
}

}  // namespace megatron::ops::checks
