#include "megatron/ops/checks/rope.h"

#include "megatron/ops/checks/attention.h"

namespace megatron::ops::checks {
namespace {

// rot_dim of head dim D: Python's int(D * percent), even.
int64_t rotary_dim(int64_t D, const RopeParams& p, const char* op) {
  MEGATRON_CHECK(p.percent > 0.0f && p.percent <= 1.0f, op << ": rotary percent " << p.percent << " must be in (0, 1]");
  const auto rot_dim = int64_t(double(D) * double(p.percent));
  MEGATRON_CHECK(rot_dim % 2 == 0, op << ": rotary dim int(" << D << " * " << p.percent << ") = " << rot_dim
                                      << " must be even; choose a rotary percent that gives an even dim");
  return rot_dim;
}

}  // namespace

RopeDims check_rope(const Tensor& y, const Tensor& x, const RopeParams& p, const char* op, const char* y_name,
                    const char* x_name, TensorCheck device) {
  check_defined(x, x_name);
  device(x, x_name);
  device(y, y_name);
  MEGATRON_CHECK(x.ndim() == 4, x_name << " must be (S,B,H,D), got " << shape_str(x.shape()));
  check_shape(y, x.shape(), y_name);
  check_dtype(y, x.dtype(), y_name);
  const int64_t D = x.dim(3);
  return {x.dim(0), x.dim(1), x.dim(2), D, rotary_dim(D, p, op)};
}

RopeQkvDims check_rope_qkv(const Tensor& qkv, int64_t num_heads, const RopeParams& p, const char* op,
                           const char* qkv_name, TensorCheck device) {
  const AttentionDims d = check_fused_qkv_layout(qkv, num_heads, qkv_name, device);
  return {d.S, d.B, d.G, d.NH / d.G, d.HS, rotary_dim(d.HS, p, op)};
}

}  // namespace megatron::ops::checks
