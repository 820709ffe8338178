// The log-sum-exp merge of two partial attentions (ops/attention.h: attention_merge) on CUDA: one
// thread per (batch, head, row), the row's HS elements in a loop; arithmetic in float as the CPU
// reference's for f32, bf16 and f16.
#include <cmath>

#include "megatron/ops/attention.h"
#include "megatron/ops/checks/attention.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

template <class T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* block_out, const float* block_lse, int64_t S,
                                       int64_t B, int64_t NH, int64_t HS, int64_t Sb, int64_t offset) {
  const int64_t rows = B * NH * Sb;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = r % Sb, bh = r / Sb, b = bh / NH, h = bh % NH;
    float& l = lse[bh * S + offset + i];
    const float lb = block_lse[bh * Sb + i];
    if (lb == -INFINITY) continue;  // the block's keys are all hidden from this row
    const float m = fmaxf(l, lb);
    const float merged = m + logf(expf(l - m) + expf(lb - m));
    const float w = expf(l - merged), wb = expf(lb - merged);
    T* o = out + (((offset + i) * B + b) * NH + h) * HS;
    const T* ob = block_out + ((i * B + b) * NH + h) * HS;
    for (int64_t e = 0; e < HS; ++e) o[e] = from_float<T>(w * to_float(o[e]) + wb * to_float(ob[e]));
    l = merged;
  }
}

}  // namespace
}  // namespace megatron::ops::cuda

// The op, defined against its one declaration (MEGATRON_OP in ops/attention.h).
namespace megatron::ops {

void cuda::attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                           int64_t row_offset) {
  const checks::AttentionDims d = checks::check_attention_merge(out, lse, block_out, block_lse, row_offset, check_cuda);
  const int64_t Sb = block_out.dim(0);
  if (Sb * d.B * d.NH == 0) return;
  dispatch_storage(out.dtype(), "attention_merge", [&]<class T>(std::type_identity<T>) {
    attention_merge_kernel<T><<<grid_for(Sb * d.B * d.NH), kThreads, 0, stream()>>>(
        device_data<T>(out), lse.data<float>(), device_data<T>(block_out), block_lse.data<float>(), d.S, d.B, d.NH,
        d.HS, Sb, row_offset);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
