#pragma once
// Token embedding lookup, written sequence-major. tokens: (B,S) i32.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct EmbeddingParams {
  int64_t vocab_start = 0;
  bool accumulate = false;
  // The backward's bits the same on every run (Megatron's --deterministic-mode). The CPU op always
  // is; the CUDA op then adds each id's rows in token order, as the CPU op, equal to it bit for
  // bit, instead of with float atomics in whatever order they land.
  bool deterministic = false;
};

// out (S,B,C) [+]= weight[tokens(B,S)^T - vocab_start]
// Ids outside [vocab_start, vocab_start + V_local) give zero rows (vocab-parallel masking;
// V_local = weight rows). accumulate=true adds instead of writing, which is how a learned
// position embedding is added (tokens = position ids).
MEGATRON_OP(embedding_forward,
            void(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params));
// dweight (V_local,C) += scatter of dout rows at those ids (masked ids skipped).
MEGATRON_OP(embedding_backward,
            void(Tensor& dweight, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& params));

}  // namespace megatron::ops
