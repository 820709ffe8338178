#pragma once
// Error checking for every CUDA runtime and cuBLAS call: failures throw megatron::Error with
// the call, the error name and the location. For CUDA code (.cu files) only.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "megatron/core/error.h"

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    const cudaError_t megatron_cuda_status_ = (call);                                      \
    MEGATRON_CHECK(megatron_cuda_status_ == cudaSuccess,                                   \
                   #call << " failed: " << cudaGetErrorName(megatron_cuda_status_) << " (" \
                         << cudaGetErrorString(megatron_cuda_status_) << ")");             \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                        \
  do {                                                                                            \
    const cublasStatus_t megatron_cublas_status_ = (call);                                        \
    MEGATRON_CHECK(megatron_cublas_status_ == CUBLAS_STATUS_SUCCESS,                              \
                   #call << " failed: " << cublasLtGetStatusName(megatron_cublas_status_) << " (" \
                         << cublasLtGetStatusString(megatron_cublas_status_) << ")");             \
  } while (0)
