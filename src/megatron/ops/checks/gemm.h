#pragma once
// Argument checks of the GEMM family (ops/gemm.h), shared by ops/cpu/gemm.cpp and ops/cuda/gemm.cu.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/gemm.h"

namespace megatron::ops::checks {

// What differs between backends: the device rule, and which operand dtypes the backend computes in.
struct GemmBackend {
  TensorCheck device;
  TensorCheck operand_dtype;
};

// Row-major C (m,n) = op(A) (m,k) op(B) (k,n).
struct MatmulDims {
  int64_t m, n, k;
};
MatmulDims check_matmul(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params,
                        const GemmBackend& backend);
// The dimensions of row-major C = op(A) op(B) for 2-D views, checked to fit; `op` names the op in
// the messages (matmul, fp8_matmul).
MatmulDims check_matmul_dims(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params,
                             const char* op);

// x (n rows, in_features), weight (out_features, in_features).
struct LinearDims {
  int64_t n, out_features, in_features;
};
LinearDims check_linear_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const GemmBackend& backend);
LinearDims check_linear_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                 const Tensor& x, const Tensor& weight, const GemmBackend& backend);
// linear_forward's checks, plus pre like y.
LinearDims check_linear_gelu_forward(const Tensor& y, const Tensor& pre, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias, const GemmBackend& backend);
// linear_backward's checks (without dx), plus dpre and pre like x.
LinearDims check_gelu_linear_backward(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                      const Tensor& x, const Tensor& weight, const Tensor& pre,
                                      const GemmBackend& backend);

}  // namespace megatron::ops::checks
