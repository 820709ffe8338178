#pragma once
// The cuBLAS / cuBLASLt element type of a tensor dtype, shared by the GEMM families (gemm.cu,
// grouped_gemm.cu): f32, bf16 and f16; anything else is refused with the fix.
#include <library_types.h>

#include "megatron/core/dtype.h"
#include "megatron/core/error.h"

namespace megatron::ops::cuda {

inline cudaDataType blas_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f64:
      MEGATRON_FAIL("GEMM on CUDA: f64 tensors are CPU-only (gradient checks); use f32, bf16 or f16, or --device cpu");
    default:
      MEGATRON_FAIL("GEMM on CUDA takes f32, bf16 or f16, got " << dtype_name(dtype));
  }
}

}  // namespace megatron::ops::cuda
