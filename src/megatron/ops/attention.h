#pragma once
// Core attention with grouped-query heads (flash-attention contract).
//   q (S,B,NH,HS); k, v (S,B,G,HS) with NH % G == 0; query head h reads kv group h / (NH/G).
//   out (S,B,NH,HS) = softmax(scale * q k^T [+ causal mask]) v, with dropout on the
//   probabilities (mask from CounterRng{seed, stream}, element index ((b*NH + h)*S + i)*S + j,
//   kept when uniform > p, kept values scaled by 1/(1-p)). Under tensor parallelism a rank holds
//   query heads [head_offset, head_offset + NH) of total_heads: h and NH in that index are the
//   global ones, so the masks, like the model, do not depend on TP.
//   segment_ids (B,S) i32, optional (document masking, Megatron's --reset-attention-mask): query i
//   sees key j only when both carry the same segment id (and, causally, j <= i). A query row that
//   sees no key gets out = 0, lse = -inf.
//   lse (B,NH,S) f32 (f64 for f64 q): log-sum-exp of each row of the scaled scores, returned so
//   backward recomputes the probabilities instead of storing them.
// Backward overwrites dq, dk, dv. dtypes: f32, bf16, f16 and f64 on the CPU; f32, bf16 and f16 on CUDA.
//
// Fused QKV (Megatron's per-query-group layout): qkv (S,B,G,(r+2)*HS), r = NH/G; each group
// holds its r query heads, then one key head, then one value head. split copies them out to
// q (S,B,NH,HS), k, v (S,B,G,HS); merge is its backward (overwrites dqkv).
// attention_forward_qkv / attention_backward_qkv are attention on the q, k, v that split would
// cut from qkv (NH = num_heads), the backward overwriting dqkv with the merge of dq, dk, dv: by
// definition (and on the CPU) split + attention (+ merge); CUDA reads q, k, v in place and writes
// dqkv in place where cuDNN runs the MHA layout (G == NH), sparing the copies.
#include <cstdint>

#include "megatron/core/tensor.h"

namespace megatron::ops {

struct AttentionParams {
  bool causal = true;
  float softmax_scale = 1.0f;  // usually 1/sqrt(HS)
  float dropout_p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  int64_t head_offset = 0;  // global index of this rank's first query head (dropout index)
  int64_t total_heads = 0;  // global number of query heads; 0 = NH (no tensor parallelism)
  Tensor segment_ids{};     // undefined = one document per sequence
};

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params);
void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                           const AttentionParams& params);
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t num_heads, const AttentionParams& params);

namespace cpu {
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params);
void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                           const AttentionParams& params);
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t num_heads, const AttentionParams& params);
}  // namespace cpu

namespace cuda {  // ops/cuda/, built with the CUDA backend
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params);
void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                           const AttentionParams& params);
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t num_heads, const AttentionParams& params);
}  // namespace cuda

}  // namespace megatron::ops
