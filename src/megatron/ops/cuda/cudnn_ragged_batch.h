#pragma once
// Packed documents as cuDNN's ragged batch (attention_cudnn.h): the per-document int32 arrays a
// launch binds (actual lengths, and the element offsets of each ragged tensor) computed on the GPU
// from cu_seqlens, and the moves of the softmax stats between cuDNN's token-major (tokens, NH)
// layout and attention's lse (B,NH,S). Free of CUDA headers.
#include <array>
#include <cstdint>

namespace megatron::ops::cuda {

// Where the ragged batch's tokens live: cu_seqlens (N+1) i32 on the GPU over the batch-major token
// index t = b*S + s of `rows` rows of `row_length` positions, padded to `entries` >= N batch
// entries (the bucketed graph's B).
struct RaggedBatch {
  const int32_t* cu_seqlens;
  int64_t documents, entries, rows, row_length;
};

// A ragged tensor's element strides of one row (b) and one position (s).
struct RowStrides {
  int64_t row, position;
};
inline constexpr int kRaggedTensors = 5;  // q, k, v, out, stats

// Fills lengths[e] (e < entries): document e's length, 0 for the entries past the documents; and
// offsets[i][e] (e <= entries) for the tensor of strides[i]: the element offset of document e's
// first token (row * strides.row + position * strides.position; the entries past the documents
// start at the end, t = B*S). Runs on the current stream.
void ragged_batch_arrays(const RaggedBatch& batch, const std::array<RowStrides, kRaggedTensors>& strides,
                         int32_t* lengths, const std::array<int32_t*, kRaggedTensors>& offsets);

// Copies stats (rows*row_length tokens, heads) f32 into lse (rows, heads, row_length) f32
// (to_lse), or back: lse[b, h, s] = stats[(b*S + s)*heads + h]. Runs on the current stream.
void ragged_stats_copy(int64_t rows, int64_t heads, int64_t row_length, float* stats, float* lse, bool to_lse);

}  // namespace megatron::ops::cuda
