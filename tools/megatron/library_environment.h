#pragma once
// The environment the `megatron` executable gives the CUDA and NCCL libraries. They read it once,
// when they start (CUDA at the process's first context, NCCL at its first communicator), so each
// default is set before either, and a value the user set stands. This is policy of the program:
// library code (src/megatron) only reads the environment.
#include <cstdint>

namespace megatron::tools {

// NCCL_NVLS_ENABLE=0: NVLink multicast stays off (it can put a host's shared GPUs out of service;
// parallel/nccl_communicator.h refuses to build a communicator with any other value). Set first
// thing, for every subcommand.
void set_nccl_defaults();

// CUDA_DEVICE_MAX_CONNECTIONS=1 for a tensor-parallel training run (Megatron's requirement): with
// one hardware queue the device starts kernels in issue order, so a collective issued before the
// GEMM it overlaps gets its SMs before the GEMM fills them (llama-3b on 4xH200: 1.5-3% faster at
// TP 2, 7% at TP 4; docs/PERFORMANCE.md). Set once the arguments are parsed, before training starts.
void set_tensor_parallel_defaults(int64_t tensor_model_parallel_size);

// NCCL_ALGO=Ring for a run with --deterministic-mode (Megatron's default there): a collective's
// sums then run in a fixed order. Set once the arguments are parsed; pretrain checks a value the
// launcher set (training/determinism.h).
void set_deterministic_defaults(bool deterministic_mode);

}  // namespace megatron::tools
