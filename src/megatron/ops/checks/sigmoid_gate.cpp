#include "megatron/ops/checks/sigmoid_gate.h"

namespace megatron::ops::checks {
namespace {

// A tensor of x's shape and dtype (out, y, dy, dout, dx).
void check_like_x(const Tensor& t, const Tensor& x, const char* name, TensorCheck device) {
  check_defined(t, name);
  device(t, name);
  check_dtype(t, x.dtype(), name);
  check_shape(t, x.shape(), name);
}

// x (N,H) and w (H), of one dtype; score (N) in the accumulation dtype.
void check_inputs(const Tensor& x, const Tensor& w, const Tensor& score, TensorCheck device) {
  const int64_t rows = rows_of(x, "sigmoid_gate x");
  device(x, "sigmoid_gate x");
  check_numel(w, x.dim(-1), "sigmoid_gate w");
  device(w, "sigmoid_gate w");
  check_dtype(w, x.dtype(), "sigmoid_gate w");
  check_numel(score, rows, "sigmoid_gate score");
  device(score, "sigmoid_gate score");
  check_dtype(score, accum_dtype(x.dtype()), "sigmoid_gate score");
}

}  // namespace

void check_sigmoid_gate_forward(const Tensor& y, const Tensor& score, const Tensor& out, const Tensor& x,
                                const Tensor& w, TensorCheck device) {
  check_inputs(x, w, score, device);
  check_like_x(out, x, "sigmoid_gate_forward out", device);
  check_like_x(y, x, "sigmoid_gate_forward y", device);
}

void check_sigmoid_gate_backward(const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& dy,
                                 const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& score,
                                 TensorCheck device) {
  check_inputs(x, w, score, device);
  check_like_x(out, x, "sigmoid_gate_backward out", device);
  check_like_x(dy, x, "sigmoid_gate_backward dy", device);
  check_like_x(dout, x, "sigmoid_gate_backward dout", device);
  check_like_x(dx, x, "sigmoid_gate_backward dx", device);
  check_numel(dw, w.numel(), "sigmoid_gate_backward dw");
  device(dw, "sigmoid_gate_backward dw");
  check_dtype(dw, accum_dtype(x.dtype()), "sigmoid_gate_backward dw");
}

}  // namespace megatron::ops::checks
