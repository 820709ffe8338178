#pragma once
// MEGATRON_HD marks a small function that host code and CUDA kernels both call, so the CPU
// reference and the kernels share one definition of the arithmetic.
#if defined(__CUDACC__)
#define MEGATRON_HD __host__ __device__ inline
#else
#define MEGATRON_HD inline
#endif
