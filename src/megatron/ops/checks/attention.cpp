#include "megatron/ops/checks/attention.h"

namespace megatron::ops::checks {
namespace {

void check_4d(const Tensor& t, const Shape& shape, DType dtype, const char* name, TensorCheck device) {
  device(t, name);
  check_shape(t, shape, name);
  check_dtype(t, dtype, name);
}

void check_params(const AttentionParams& p, const AttentionDims& d, TensorCheck device) {
  MEGATRON_CHECK(p.dropout_p >= 0.0f && p.dropout_p < 1.0f,
                 "attention dropout " << p.dropout_p << " must be in [0, 1)");
  const int64_t total = p.total_heads == 0 ? d.NH : p.total_heads;
  MEGATRON_CHECK(p.head_offset >= 0 && p.head_offset + d.NH <= total,
                 "attention: query heads [" << p.head_offset << ", " << p.head_offset + d.NH << ") of this rank lie "
                                            << "outside the " << total << " heads of the model (total_heads)");
  MEGATRON_CHECK(p.window >= -1, "attention window " << p.window << " must be >= 0, or -1 for no sliding window");
  if (p.segment_ids.defined()) {
    device(p.segment_ids, "attention segment_ids");
    check_shape(p.segment_ids, {d.B, d.S}, "attention segment_ids");
    check_dtype(p.segment_ids, DType::i32, "attention segment_ids");
  }
  if (p.key_segment_ids.defined()) {
    MEGATRON_CHECK(p.segment_ids.defined(),
                   "attention key_segment_ids without segment_ids: the keys' documents "
                   "are compared with the queries'; give the queries' segment_ids too");
    device(p.key_segment_ids, "attention key_segment_ids");
    check_shape(p.key_segment_ids, {d.B, d.S}, "attention key_segment_ids");
    check_dtype(p.key_segment_ids, DType::i32, "attention key_segment_ids");
  }
  if (p.cu_seqlens.defined()) {
    MEGATRON_CHECK(!p.segment_ids.defined(), "attention: cu_seqlens and segment_ids both given; they are two forms "
                                             "of the documents, pass one (cu_seqlens for packed documents)");
    device(p.cu_seqlens, "attention cu_seqlens");
    check_dtype(p.cu_seqlens, DType::i32, "attention cu_seqlens");
    MEGATRON_CHECK(p.cu_seqlens.ndim() == 1 && p.cu_seqlens.dim(0) >= 2,
                   "attention cu_seqlens must be (N+1) for N >= 1 documents, got " << shape_str(p.cu_seqlens.shape()));
    // The values are readable only on the host; a device copy comes from checked host values.
    MEGATRON_CHECK(p.max_seqlen >= 0 && p.max_seqlen <= d.S,
                   "attention max_seqlen " << p.max_seqlen << " must be in [0, S = " << d.S << "] (0: S)");
    if (p.cu_seqlens.device().is_cpu()) check_cu_seqlens(p.cu_seqlens, d.B, d.S, p.max_seqlen);
  } else {
    MEGATRON_CHECK(p.max_seqlen == 0, "attention max_seqlen " << p.max_seqlen << " without cu_seqlens; it bounds "
                                                              << "packed documents' lengths, pass 0 without them");
  }
}

void check_lse(const Tensor& lse, const AttentionDims& d, DType q_dtype, TensorCheck device) {
  device(lse, "attention lse");
  check_shape(lse, {d.B, d.NH, d.S}, "attention lse");
  check_dtype(lse, accum_dtype(q_dtype), "attention lse");
}

}  // namespace

AttentionDims check_attention_qkv(const Tensor& q, const Tensor& k, const Tensor& v, TensorCheck device) {
  check_defined(q, "attention q");
  check_defined(k, "attention k");
  device(q, "attention q");
  device(k, "attention k");
  MEGATRON_CHECK(q.ndim() == 4, "attention q must be (S,B,NH,HS), got " << shape_str(q.shape()));
  MEGATRON_CHECK(k.ndim() == 4, "attention k must be (S,B,G,HS), got " << shape_str(k.shape()));
  const AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  MEGATRON_CHECK(d.G > 0 && d.NH % d.G == 0, "attention: " << d.NH << " query heads cannot be grouped over " << d.G
                                                           << " kv heads; NH % G must be 0");
  check_4d(k, {d.S, d.B, d.G, d.HS}, q.dtype(), "attention k", device);
  check_4d(v, {d.S, d.B, d.G, d.HS}, q.dtype(), "attention v", device);
  return d;
}

AttentionDims check_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const AttentionParams& params, const AttentionBackend& backend) {
  const AttentionDims d = check_attention_qkv(q, k, v, backend.device);
  check_params(params, d, backend.device);
  check_4d(out, q.shape(), q.dtype(), "attention out", backend.device);
  backend.q_dtype(q, "attention_forward");
  check_lse(lse, d, q.dtype(), backend.device);
  return d;
}

AttentionDims check_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                       const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, const AttentionParams& params,
                                       const AttentionBackend& backend) {
  const AttentionDims d = check_attention_qkv(q, k, v, backend.device);
  check_params(params, d, backend.device);
  check_4d(out, q.shape(), q.dtype(), "attention out", backend.device);
  check_4d(dout, q.shape(), q.dtype(), "attention dout", backend.device);
  check_4d(dq, q.shape(), q.dtype(), "attention dq", backend.device);
  check_4d(dk, k.shape(), q.dtype(), "attention dk", backend.device);
  check_4d(dv, k.shape(), q.dtype(), "attention dv", backend.device);
  backend.q_dtype(q, "attention_backward");
  check_lse(lse, d, q.dtype(), backend.device);
  return d;
}

AttentionDims check_fused_qkv_layout(const Tensor& qkv, int64_t num_heads, const char* name, TensorCheck device) {
  check_defined(qkv, name);
  device(qkv, name);
  MEGATRON_CHECK(qkv.ndim() == 4, name << " must be (S,B,G,(NH/G+2)*HS), got " << shape_str(qkv.shape()));
  const int64_t G = qkv.dim(2);
  MEGATRON_CHECK(num_heads > 0 && G > 0 && num_heads % G == 0,
                 name << ": " << num_heads << " query heads cannot be grouped over the " << G << " kv heads of "
                      << shape_str(qkv.shape()) << "; NH % G must be 0");
  const int64_t slots = num_heads / G + 2;  // r query heads, one key head, one value head per group
  MEGATRON_CHECK(qkv.dim(3) % slots == 0, name << " " << shape_str(qkv.shape())
                                               << ": the last dim must be (NH/G + 2)*HS = " << slots
                                               << "*HS for NH = " << num_heads);
  return AttentionDims{qkv.dim(0), qkv.dim(1), num_heads, G, qkv.dim(3) / slots};
}

AttentionDims check_qkv_fused(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v,
                              TensorCheck device) {
  const AttentionDims d = check_attention_qkv(q, k, v, device);
  const int64_t r = d.NH / d.G;
  check_4d(qkv, {d.S, d.B, d.G, (r + 2) * d.HS}, q.dtype(), "qkv", device);
  return d;
}

AttentionDims check_attention_forward_qkv(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                          const AttentionParams& params, const AttentionBackend& backend) {
  const AttentionDims d = check_fused_qkv_layout(qkv, num_heads, "attention qkv", backend.device);
  check_params(params, d, backend.device);
  check_4d(out, {d.S, d.B, d.NH, d.HS}, qkv.dtype(), "attention out", backend.device);
  backend.q_dtype(qkv, "attention_forward_qkv");
  check_lse(lse, d, qkv.dtype(), backend.device);
  return d;
}

AttentionDims check_attention_backward_qkv(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                           const Tensor& lse, int64_t num_heads, const AttentionParams& params,
                                           const AttentionBackend& backend) {
  const AttentionDims d = check_fused_qkv_layout(qkv, num_heads, "attention qkv", backend.device);
  check_params(params, d, backend.device);
  check_4d(out, {d.S, d.B, d.NH, d.HS}, qkv.dtype(), "attention out", backend.device);
  check_4d(dout, {d.S, d.B, d.NH, d.HS}, qkv.dtype(), "attention dout", backend.device);
  check_4d(dqkv, qkv.shape(), qkv.dtype(), "attention dqkv", backend.device);
  backend.q_dtype(qkv, "attention_backward_qkv");
  check_lse(lse, d, qkv.dtype(), backend.device);
  return d;
}

AttentionDims check_attention_merge(const Tensor& out, const Tensor& lse, const Tensor& block_out,
                                    const Tensor& block_lse, int64_t row_offset, TensorCheck device) {
  check_defined(out, "attention_merge out");
  check_defined(block_out, "attention_merge block_out");
  device(out, "attention_merge out");
  device(block_out, "attention_merge block_out");
  MEGATRON_CHECK(out.ndim() == 4, "attention_merge out must be (S,B,NH,HS), got " << shape_str(out.shape()));
  const AttentionDims d{out.dim(0), out.dim(1), out.dim(2), out.dim(2), out.dim(3)};
  MEGATRON_CHECK(block_out.ndim() == 4,
                 "attention_merge block_out must be (Sb,B,NH,HS), got " << shape_str(block_out.shape()));
  const int64_t Sb = block_out.dim(0);
  MEGATRON_CHECK(row_offset >= 0 && row_offset + Sb <= d.S, "attention_merge: block rows ["
                                                                << row_offset << ", " << row_offset + Sb
                                                                << ") lie outside the " << d.S << " rows of out");
  check_4d(block_out, {Sb, d.B, d.NH, d.HS}, out.dtype(), "attention_merge block_out", device);
  device(lse, "attention_merge lse");
  check_shape(lse, {d.B, d.NH, d.S}, "attention_merge lse");
  check_dtype(lse, accum_dtype(out.dtype()), "attention_merge lse");
  device(block_lse, "attention_merge block_lse");
  check_shape(block_lse, {d.B, d.NH, Sb}, "attention_merge block_lse");
  check_dtype(block_lse, accum_dtype(out.dtype()), "attention_merge block_lse");
  return d;
}

}  // namespace megatron::ops::checks
