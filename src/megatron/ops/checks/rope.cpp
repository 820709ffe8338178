#include "megatron/ops/checks/rope.h"

namespace megatron::ops::checks {

RopeDims check_rope(const Tensor& y, const Tensor& x, const RopeParams& p, const char* op, const char* y_name,
                    const char* x_name, TensorCheck device) {
  check_defined(x, x_name);
  device(x, x_name);
  device(y, y_name);
  MEGATRON_CHECK(x.ndim() == 4, x_name << " must be (S,B,H,D), got " << shape_str(x.shape()));
  check_shape(y, x.shape(), y_name);
  check_dtype(y, x.dtype(), y_name);
  MEGATRON_CHECK(p.percent > 0.0f && p.percent <= 1.0f, op << ": rotary percent " << p.percent << " must be in (0, 1]");
  const int64_t D = x.dim(3);
  const auto rot_dim = int64_t(double(D) * double(p.percent));  // Python's int(D * percent)
  MEGATRON_CHECK(rot_dim % 2 == 0, op << ": rotary dim int(" << D << " * " << p.percent << ") = " << rot_dim
                                      << " must be even; choose a rotary percent that gives an even dim");
  return {x.dim(0), x.dim(1), x.dim(2), D, rot_dim};
}

}  // namespace megatron::ops::checks
