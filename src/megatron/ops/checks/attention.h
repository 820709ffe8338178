#pragma once
// Argument checks of core attention and the fused-QKV layout (ops/attention.h), shared by
// ops/cpu/attention.cpp and ops/cuda/attention*.cu.
#include "megatron/ops/attention.h"
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

struct AttentionBackend {
  TensorCheck device;
  // Rejects a q dtype the backend has no kernel for; called with the op's name before the lse
  // check, whose expected dtype derives from q's, so an unsupported q is reported as such.
  TensorCheck q_dtype;
};

// q, out (S,B,NH,HS); k, v (S,B,G,HS); lse (B,NH,S).
struct AttentionDims {
  int64_t S, B, NH, G, HS;
};
// q, k, v: defined, on the backend's device, one dtype, GQA-compatible shapes.
AttentionDims check_attention_qkv(const Tensor& q, const Tensor& k, const Tensor& v, TensorCheck device);
AttentionDims check_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const AttentionParams& params, const AttentionBackend& backend);
AttentionDims check_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, const AttentionParams& params,
                                       const AttentionBackend& backend);
// qkv (S,B,G,(NH/G + 2)*HS) for NH = num_heads query heads: defined, on the backend's device, its
// last dim whole groups of NH/G + 2 heads; errors say `name`. Returns its dims.
AttentionDims check_fused_qkv_layout(const Tensor& qkv, int64_t num_heads, const char* name, TensorCheck device);
// qkv (S,B,G,(NH/G + 2)*HS) against q, k, v (qkv_split, qkv_merge).
AttentionDims check_qkv_fused(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, TensorCheck device);
// Fused-QKV attention: qkv (S,B,G,(NH/G + 2)*HS) with NH = num_heads, out and dout (S,B,NH,HS),
// dqkv like qkv, lse (B,NH,S).
AttentionDims check_attention_forward_qkv(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                          const AttentionParams& params, const AttentionBackend& backend);
AttentionDims check_attention_backward_qkv(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                           const Tensor& lse, int64_t num_heads, const AttentionParams& params,
                                           const AttentionBackend& backend);
// attention_merge: out (S,B,NH,HS), lse (B,NH,S), block_out (Sb,B,NH,HS), block_lse (B,NH,Sb) with
// the block's rows [row_offset, row_offset + Sb) inside out's; lse dtypes accum_dtype(out).
AttentionDims check_attention_merge(const Tensor& out, const Tensor& lse, const Tensor& block_out,
                                    const Tensor& block_lse, int64_t row_offset, TensorCheck device);

}  // namespace megatron::ops::checks
