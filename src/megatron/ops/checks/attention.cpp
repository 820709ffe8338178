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
  if (p.segment_ids.defined()) {
    device(p.segment_ids, "attention segment_ids");
    check_shape(p.segment_ids, {d.B, d.S}, "attention segment_ids");
    check_dtype(p.segment_ids, DType::i32, "attention segment_ids");
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

AttentionDims check_qkv_fused(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v,
                              TensorCheck device) {
  const AttentionDims d = check_attention_qkv(q, k, v, device);
  const int64_t r = d.NH / d.G;
  check_4d(qkv, {d.S, d.B, d.G, (r + 2) * d.HS}, q.dtype(), "qkv", device);
  return d;
}

}  // namespace megatron::ops::checks
