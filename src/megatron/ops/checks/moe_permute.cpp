#include "megatron/ops/checks/moe_permute.h"

namespace megatron::ops::checks {
namespace {

// a (N,H) matrix of rows
void check_matrix(const Tensor& t, const char* name, TensorCheck device) {
  check_defined(t, name);
  device(t, name);
  MEGATRON_CHECK(t.ndim() == 2, name << " must be 2-D (rows, hidden), got " << shape_str(t.shape()));
}

void check_index(const Tensor& t, const Shape& shape, const char* name, TensorCheck device) {
  check_defined(t, name);
  device(t, name);
  check_dtype(t, DType::i32, name);
  check_shape(t, shape, name);
}

// token_rows (T,E) i32 for T tokens
void check_token_rows(const Tensor& token_rows, int64_t tokens, const char* name, TensorCheck device) {
  check_defined(token_rows, name);
  MEGATRON_CHECK(token_rows.ndim() == 2 && token_rows.dim(0) == tokens,
                 name << " must be (T,E) with T = " << tokens << ", got " << shape_str(token_rows.shape()));
  check_index(token_rows, token_rows.shape(), name, device);
}

void check_weight(const Tensor& w, const Shape& shape, DType values, const char* name, TensorCheck device) {
  if (!w.defined()) return;
  device(w, name);
  check_dtype(w, accum_dtype(values), name);
  check_shape(w, shape, name);
}

}  // namespace

void check_moe_permute(const Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight,
                       TensorCheck device) {
  check_matrix(x, "moe_permute x", device);
  check_matrix(rows, "moe_permute rows", device);
  check_dtype(rows, x.dtype(), "moe_permute rows");
  MEGATRON_CHECK(rows.dim(1) == x.dim(1), "moe_permute rows have " << rows.dim(1) << " columns, x has " << x.dim(1));
  check_index(row_token, {rows.dim(0)}, "moe_permute row_token", device);
  check_weight(row_weight, {rows.dim(0)}, x.dtype(), "moe_permute row_weight", device);
}

void check_moe_unpermute(const Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight,
                         TensorCheck device) {
  check_matrix(out, "moe_unpermute out", device);
  check_matrix(rows, "moe_unpermute rows", device);
  check_dtype(out, rows.dtype(), "moe_unpermute out");
  MEGATRON_CHECK(rows.dim(1) == out.dim(1),
                 "moe_unpermute rows have " << rows.dim(1) << " columns, out has " << out.dim(1));
  check_token_rows(token_rows, out.dim(0), "moe_unpermute token_rows", device);
  check_weight(weight, token_rows.shape(), rows.dtype(), "moe_unpermute weight", device);
}

void check_moe_unpermute_weight_backward(const Tensor& dweight, const Tensor& dout, const Tensor& rows,
                                         const Tensor& token_rows, TensorCheck device) {
  check_matrix(dout, "moe_unpermute_weight_backward dout", device);
  check_matrix(rows, "moe_unpermute_weight_backward rows", device);
  check_dtype(rows, dout.dtype(), "moe_unpermute_weight_backward rows");
  MEGATRON_CHECK(rows.dim(1) == dout.dim(1),
                 "moe_unpermute_weight_backward rows have " << rows.dim(1) << " columns, dout has " << dout.dim(1));
  check_token_rows(token_rows, dout.dim(0), "moe_unpermute_weight_backward token_rows", device);
  check_defined(dweight, "moe_unpermute_weight_backward dweight");
  check_weight(dweight, token_rows.shape(), dout.dtype(), "moe_unpermute_weight_backward dweight", device);
}

}  // namespace megatron::ops::checks
