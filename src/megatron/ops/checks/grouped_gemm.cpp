#include "megatron/ops/checks/grouped_gemm.h"

namespace megatron::ops::checks {
namespace {

// x (N,in) rows and weight (E,out,in) on the backend's device; rows: E non-negative counts summing
// to N, or E+1 i32 offsets on the device (their values are the routing's, not read here).
void check_operands(const Tensor& x, const Tensor& weight, const ExpertRows& rows, const char* op,
                    TensorCheck device) {
  check_defined(x, "grouped GEMM x");
  check_defined(weight, "grouped GEMM weight");
  device(x, "grouped GEMM x");
  device(weight, "grouped GEMM weight");
  MEGATRON_CHECK(x.ndim() == 2, op << ": x must be (N,in), got " << shape_str(x.shape()));
  MEGATRON_CHECK(weight.ndim() == 3 && weight.dim(2) == x.dim(1),
                 op << ": weight must be (E,out,in) with in = " << x.dim(1) << ", got " << shape_str(weight.shape()));
  check_dtype(weight, x.dtype(), "grouped GEMM weight");
  if (rows.offsets.defined()) {
    device(rows.offsets, "grouped GEMM row offsets");
    check_dtype(rows.offsets, DType::i32, "grouped GEMM row offsets");
    check_shape(rows.offsets, {weight.dim(0) + 1}, "grouped GEMM row offsets");
    return;
  }
  MEGATRON_CHECK(int64_t(rows.counts.size()) == weight.dim(0),
                 op << ": " << rows.counts.size() << " row counts for " << weight.dim(0) << " experts");
  int64_t total = 0;
  for (int64_t n : rows.counts) {
    MEGATRON_CHECK(n >= 0, op << ": a negative row count " << n);
    total += n;
  }
  MEGATRON_CHECK(total == x.dim(0), op << ": the row counts sum to " << total << ", x has " << x.dim(0) << " rows");
}

}  // namespace

void check_grouped_linear_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                                  const ExpertRows& rows, TensorCheck device) {
  check_operands(x, weight, rows, "grouped_linear_forward", device);
  check_defined(y, "grouped_linear_forward y");
  device(y, "grouped_linear_forward y");
  check_shape(y, {x.dim(0), weight.dim(1)}, "grouped_linear_forward y");
  check_dtype(y, x.dtype(), "grouped_linear_forward y");
}

void check_grouped_linear_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                                   const Tensor& weight, const ExpertRows& rows, TensorCheck device) {
  check_operands(x, weight, rows, "grouped_linear_backward", device);
  check_defined(dy, "grouped_linear_backward dy");
  device(dy, "grouped_linear_backward dy");
  check_shape(dy, {x.dim(0), weight.dim(1)}, "grouped_linear_backward dy");
  check_dtype(dy, x.dtype(), "grouped_linear_backward dy");
  if (dx.defined()) {
    device(dx, "grouped_linear_backward dx");
    check_shape(dx, x.shape(), "grouped_linear_backward dx");
    check_dtype(dx, x.dtype(), "grouped_linear_backward dx");
  }
  if (dweight.defined()) {
    device(dweight, "grouped_linear_backward dweight");
    check_shape(dweight, weight.shape(), "grouped_linear_backward dweight");
    check_dtype(dweight, accum_dtype(x.dtype()), "grouped_linear_backward dweight");
  }
}

}  // namespace megatron::ops::checks
