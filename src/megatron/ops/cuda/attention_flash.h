#pragma once
// The CUDA backend's own attention kernels (FlashAttention-2 style: mma.sync tensor-core kernels
// for bf16 at head dims 16/32/64/128, generic kernels otherwise), without the routing of
// cuda::attention_forward/backward to cuDNN (attention_cudnn.h): what runs where cuDNN does not
// apply (dropout, other head dims, f32, misaligned tensors), and what the tests and the kernel lab
// call to check and time these kernels on their own. Contract and checks of ops/attention.h;
// dtypes f32 and bf16.
#include "megatron/core/tensor.h"
#include "megatron/ops/attention.h"

namespace megatron::ops::cuda {

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params);
void flash_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params);

}  // namespace megatron::ops::cuda
