#include "megatron/ops/checks/elementwise.h"

#include <utility>

namespace megatron::ops::checks {

void check_same_numel(const Tensor& out, const Tensor& in, const char* out_name, const char* in_name,
                      TensorCheck device) {
  check_defined(in, in_name);
  device(in, in_name);
  device(out, out_name);
  check_numel(out, in.numel(), out_name);
}

void check_add(const Tensor& out, const Tensor& a, const Tensor& b, TensorCheck device) {
  check_same_numel(out, a, "add out", "add a", device);
  check_same_numel(b, a, "add b", "add a", device);
  check_dtype(b, a.dtype(), "add b");
  check_dtype(out, a.dtype(), "add out");
}

void check_transpose01(const Tensor& out, const Tensor& in, TensorCheck device) {
  check_same_numel(out, in, "transpose01 out", "transpose01 in", device);
  MEGATRON_CHECK(in.ndim() >= 2, "transpose01 needs at least 2 dimensions, got " << shape_str(in.shape()));
  Shape swapped = in.shape();
  std::swap(swapped[0], swapped[1]);
  check_shape(out, swapped, "transpose01 out");
  check_dtype(out, in.dtype(), "transpose01 out");
  const auto* src = static_cast<const char*>(in.raw());
  const auto* dst = static_cast<const char*>(out.raw());
  MEGATRON_CHECK(dst + out.nbytes() <= src || src + in.nbytes() <= dst,
                 "transpose01 cannot run in place; give out memory that does not overlap in");
}

}  // namespace megatron::ops::checks
