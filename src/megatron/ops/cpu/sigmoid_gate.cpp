// The sigmoid gate on the CPU: dot products and the sigmoid in compute_t (float, or double for
// f64), one rounding per stored element; dw summed over rows in row order.
#include "megatron/ops/checks/sigmoid_gate.h"

#include <cmath>
#include <vector>

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/cpu/dot_row.h"
#include "megatron/ops/sigmoid_gate.h"

namespace megatron::ops::cpu {
namespace {

template <class T>
void forward_kernel(T* y, compute_t<T>* score, const T* out, const T* x, const T* w, int64_t N, int64_t H) {
  using C = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * H))
  for (int64_t t = 0; t < N; ++t) {
    const C s = C(1) / (C(1) + std::exp(-dot_row(x + t * H, w, H)));
    score[t] = s;
    for (int64_t h = 0; h < H; ++h) y[t * H + h] = store<T>(s * load(out[t * H + h]));
  }
}

template <class T>
void backward_kernel(T* dout, T* dx, compute_t<T>* dw, const T* dy, const T* out, const T* x, const T* w,
                     const compute_t<T>* score, int64_t N, int64_t H) {
  using C = compute_t<T>;
  std::vector<C> g(static_cast<size_t>(N));  // the gradient of each row's gate logit
#pragma omp parallel for if (worth_parallel(N * H))
  for (int64_t t = 0; t < N; ++t) {
    const C s = score[t];
    g[size_t(t)] = dot_row(dy + t * H, out + t * H, H) * s * (C(1) - s);
    for (int64_t h = 0; h < H; ++h) {
      dout[t * H + h] = store<T>(s * load(dy[t * H + h]));
      dx[t * H + h] = store<T>(g[size_t(t)] * load(w[h]));
    }
  }
#pragma omp parallel for if (worth_parallel(N * H))
  for (int64_t h = 0; h < H; ++h) {
    C sum = 0;
    for (int64_t t = 0; t < N; ++t) sum += g[size_t(t)] * load(x[t * H + h]);
    dw[h] += sum;
  }
}

}  // namespace
}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::sigmoid_gate_forward(Tensor& y, Tensor& score, const Tensor& out, const Tensor& x, const Tensor& w) {
  checks::check_sigmoid_gate_forward(y, score, out, x, w, check_cpu);
  dispatch_floating(x.dtype(), "sigmoid_gate_forward", [&]<class T>(std::type_identity<T>) {
    forward_kernel<T>(y.data<T>(), score.data<compute_t<T>>(), out.data<T>(), x.data<T>(), w.data<T>(), score.numel(),
                      x.dim(-1));
  });
}

void cpu::sigmoid_gate_backward(Tensor& dout, Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& out,
                                const Tensor& x, const Tensor& w, const Tensor& score) {
  checks::check_sigmoid_gate_backward(dout, dx, dw, dy, out, x, w, score, check_cpu);
  dispatch_floating(x.dtype(), "sigmoid_gate_backward", [&]<class T>(std::type_identity<T>) {
    backward_kernel<T>(dout.data<T>(), dx.data<T>(), dw.data<compute_t<T>>(), dy.data<T>(), out.data<T>(), x.data<T>(),
                       w.data<T>(), score.data<compute_t<T>>(), score.numel(), x.dim(-1));
  });
}

}  // namespace megatron::ops
