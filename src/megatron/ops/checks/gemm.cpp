#include "megatron/ops/checks/gemm.h"

#include <string>
#include <utility>

namespace megatron::ops::checks {
namespace {

void check_gemm_input(const Tensor& t, const char* name, const GemmBackend& backend) {
  check_defined(t, name);
  backend.device(t, name);
  MEGATRON_CHECK(t.ndim() >= 1, name << " must have at least one dimension, got a 0-d tensor");
  backend.operand_dtype(t, name);
}

// C may have the inputs' dtype, or f32 for 16-bit inputs (accumulation into the fp32 main grad).
void check_gemm_output(const Tensor& c, DType input, const char* name, const GemmBackend& backend) {
  backend.device(c, name);
  const bool half = input == DType::bf16 || input == DType::f16;
  MEGATRON_CHECK(c.dtype() == input || (half && c.dtype() == DType::f32),
                 name << " has dtype " << dtype_name(c.dtype()) << " for " << dtype_name(input) << " inputs; expected "
                      << dtype_name(input) << (half ? " or f32" : ""));
}

}  // namespace

MatmulDims check_matmul(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params,
                        const GemmBackend& backend) {
  check_gemm_input(a, "matmul A", backend);
  check_gemm_input(b, "matmul B", backend);
  check_dtype(b, a.dtype(), "matmul B");
  check_defined(c, "matmul C");
  check_gemm_output(c, a.dtype(), "matmul C", backend);
  MEGATRON_CHECK(!params.fp8_fast_accumulation, "matmul: fp8_fast_accumulation applies to fp8_matmul only");
  return check_matmul_dims(c, a, b, params, "matmul");
}

MatmulDims check_matmul_dims(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params,
                             const char* op) {
  MEGATRON_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
                 op << " takes 2-D views; got A " << shape_str(a.shape()) << ", B " << shape_str(b.shape()) << ", C "
                    << shape_str(c.shape()) << " (use view() to flatten)");
  const bool ta = params.trans_a == Transpose::yes, tb = params.trans_b == Transpose::yes;
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  MEGATRON_CHECK(k == kb,
                 op << " inner dimensions differ: op(A) is " << m << "x" << k << ", op(B) is " << kb << "x" << n);
  check_shape(c, {m, n}, (std::string(op) + " C").c_str());
  return {m, n, k};
}

LinearDims check_linear_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const GemmBackend& backend) {
  check_gemm_input(x, "linear x", backend);
  check_gemm_input(weight, "linear weight", backend);
  check_dtype(weight, x.dtype(), "linear weight");
  MEGATRON_CHECK(weight.ndim() == 2, "linear weight must be 2-D (out,in), got " << shape_str(weight.shape()));
  const int64_t out_features = weight.dim(0), in_features = weight.dim(1);
  MEGATRON_CHECK(x.dim(-1) == in_features, "linear x has " << x.dim(-1) << " features (shape " << shape_str(x.shape())
                                                           << "), the weight expects " << in_features);
  check_shape(y, with_last_dim(x.shape(), out_features), "linear y");
  backend.device(y, "linear y");
  check_dtype(y, x.dtype(), "linear y");
  if (bias.defined()) {
    backend.device(bias, "linear bias");
    check_shape(bias, {out_features}, "linear bias");
    check_dtype(bias, x.dtype(), "linear bias");
  }
  return {rows_of(x, "linear x"), out_features, in_features};
}

LinearDims check_linear_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                 const Tensor& x, const Tensor& weight, const GemmBackend& backend) {
  check_gemm_input(x, "linear x", backend);
  check_gemm_input(weight, "linear weight", backend);
  check_gemm_input(dy, "linear dy", backend);
  check_dtype(weight, x.dtype(), "linear weight");
  check_dtype(dy, x.dtype(), "linear dy");
  MEGATRON_CHECK(weight.ndim() == 2, "linear weight must be 2-D (out,in), got " << shape_str(weight.shape()));
  const int64_t out_features = weight.dim(0), in_features = weight.dim(1);
  check_shape(x, with_last_dim(dy.shape(), in_features), "linear x");
  check_shape(dy, with_last_dim(x.shape(), out_features), "linear dy");
  const DType grad_dtype = accum_dtype(x.dtype());
  if (dx.defined()) {
    backend.device(dx, "linear dx");
    check_shape(dx, x.shape(), "linear dx");
    check_dtype(dx, x.dtype(), "linear dx");
  }
  if (dweight.defined()) {
    backend.device(dweight, "linear dweight");
    check_shape(dweight, weight.shape(), "linear dweight");
    check_dtype(dweight, grad_dtype, "linear dweight");
  }
  if (dbias.defined()) {
    MEGATRON_CHECK(dweight.defined(),
                   "linear dbias is accumulated with dweight (the same GEMM on CUDA); "
                   "pass dweight too, or leave dbias undefined");
    backend.device(dbias, "linear dbias");
    check_shape(dbias, {out_features}, "linear dbias");
    check_dtype(dbias, grad_dtype, "linear dbias");
  }
  return {rows_of(x, "linear x"), out_features, in_features};
}

LinearDims check_linear_gelu_forward(const Tensor& y, const Tensor& pre, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias, const GemmBackend& backend) {
  const LinearDims dims = check_linear_forward(y, x, weight, bias, backend);
  check_defined(pre, "linear pre");
  backend.device(pre, "linear pre");
  check_shape(pre, y.shape(), "linear pre");
  check_dtype(pre, y.dtype(), "linear pre");
  return dims;
}

LinearDims check_gelu_linear_backward(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                      const Tensor& x, const Tensor& weight, const Tensor& pre,
                                      const GemmBackend& backend) {
  const LinearDims dims = check_linear_backward(Tensor(), dweight, dbias, dy, x, weight, backend);
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&pre, "linear pre"}, {&dpre, "linear dpre"}}) {
    check_defined(*t, name);
    backend.device(*t, name);
    check_shape(*t, x.shape(), name);
    check_dtype(*t, x.dtype(), name);
  }
  return dims;
}

}  // namespace megatron::ops::checks
