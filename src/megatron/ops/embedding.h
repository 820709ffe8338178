#pragma once
// Token embedding lookup, written sequence-major.
//   forward:  out (S,B,C) [+]= weight[tokens(B,S)^T - vocab_start]
//             Ids outside [vocab_start, vocab_start + V_local) give zero rows (vocab-parallel
//             masking; V_local = weight rows). accumulate=true adds instead of writing, which is
//             how a learned position embedding is added (tokens = position ids).
//   backward: dweight (V_local,C) += scatter of dout rows at those ids (masked ids skipped).
#include "megatron/core/tensor.h"

namespace megatron::ops {

struct EmbeddingParams {
  int64_t vocab_start = 0;
  bool accumulate = false;
};

// tokens: (B,S) i32.
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params);
void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& params);

namespace cpu {
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params);
void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& params);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params);
void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& params);
}  // namespace cuda

}  // namespace megatron::ops
