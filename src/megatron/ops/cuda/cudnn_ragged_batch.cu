#include "megatron/ops/cuda/cudnn_ragged_batch.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

struct OffsetArrays {
  int32_t* at[kRaggedTensors];
  RowStrides strides[kRaggedTensors];
};

__global__ void ragged_batch_kernel(RaggedBatch batch, int32_t* lengths, OffsetArrays offsets) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e <= batch.entries;
       e += int64_t(gridDim.x) * blockDim.x) {
    const bool real = e < batch.documents;
    const int64_t first = batch.cu_seqlens[real ? e : batch.documents];  // past the documents: B*S
    if (e < batch.entries) lengths[e] = real ? batch.cu_seqlens[e + 1] - int32_t(first) : 0;
    const int64_t row = first / batch.row_length, position = first % batch.row_length;
    for (int i = 0; i < kRaggedTensors; ++i)
      offsets.at[i][e] = int32_t(row * offsets.strides[i].row + position * offsets.strides[i].position);
  }
}

__global__ void ragged_stats_kernel(int64_t rows, int64_t heads, int64_t row_length, float* stats, float* lse,
                                    bool to_lse) {
  const int64_t total = rows * heads * row_length;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {  // idx = (b*heads + h)*row_length + s
    const int64_t s = idx % row_length, h = (idx / row_length) % heads, b = idx / (row_length * heads);
    float& token_major = stats[(b * row_length + s) * heads + h];
    if (to_lse) {
      lse[idx] = token_major;
    } else {
      token_major = lse[idx];
    }
  }
}

}  // namespace

void ragged_batch_arrays(const RaggedBatch& batch, const std::array<RowStrides, kRaggedTensors>& strides,
                         int32_t* lengths, const std::array<int32_t*, kRaggedTensors>& offsets) {
  OffsetArrays arrays{};
  for (int i = 0; i < kRaggedTensors; ++i) {
    arrays.at[i] = offsets[size_t(i)];
    arrays.strides[i] = strides[size_t(i)];
  }
  ragged_batch_kernel<<<grid_for(batch.entries + 1), kThreads, 0, stream()>>>(batch, lengths, arrays);
  CUDA_CHECK_LAUNCH();
}

void ragged_stats_copy(int64_t rows, int64_t heads, int64_t row_length, float* stats, float* lse, bool to_lse) {
  const int64_t total = rows * heads * row_length;
  ragged_stats_kernel<<<grid_for(total), kThreads, 0, stream()>>>(rows, heads, row_length, stats, lse, to_lse);
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
