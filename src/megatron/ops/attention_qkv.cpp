// The fused QKV layout's helpers shared by both backends (ops/attention.h).
#include "megatron/ops/attention.h"

namespace megatron::ops {

SplitQkv empty_split_qkv(const Tensor& qkv, int64_t num_heads) {
  const int64_t S = qkv.dim(0), B = qkv.dim(1), G = qkv.dim(2), HS = qkv.dim(3) / (num_heads / G + 2);
  return {Tensor::empty({S, B, num_heads, HS}, qkv.dtype(), qkv.device()),
          Tensor::empty({S, B, G, HS}, qkv.dtype(), qkv.device()),
          Tensor::empty({S, B, G, HS}, qkv.dtype(), qkv.device())};
}

void attention_forward_qkv_by_definition(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                         const AttentionParams& params) {
  SplitQkv s = empty_split_qkv(qkv, num_heads);
  qkv_split.backend(qkv.device())(s.q, s.k, s.v, qkv);
  attention_forward.backend(qkv.device())(out, lse, s.q, s.k, s.v, params);
}

void attention_backward_qkv_by_definition(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                          const Tensor& lse, int64_t num_heads, const AttentionParams& params) {
  SplitQkv s = empty_split_qkv(qkv, num_heads);
  qkv_split.backend(qkv.device())(s.q, s.k, s.v, qkv);
  SplitQkv d = empty_split_qkv(qkv, num_heads);
  attention_backward.backend(qkv.device())(d.q, d.k, d.v, dout, s.q, s.k, s.v, out, lse, params);
  qkv_merge.backend(qkv.device())(dqkv, d.q, d.k, d.v);
}

}  // namespace megatron::ops
