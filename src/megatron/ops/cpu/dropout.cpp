// Inverted dropout on the CPU. The mask is a pure function of (seed, stream, global element index), so
// backward regenerates it and the CUDA kernel can reproduce it exactly.
#include "megatron/ops/dropout.h"

#include "megatron/core/rng.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

// out_i = in_i * (uniform_i > p ? 1/(1-p) : 0). A multiply, not a select, so NaN and Inf in dropped
// elements still propagate (overflow detection sees them), as in PyTorch. In place is fine:
// element i reads only in_i.
template <class T>
void dropout_kernel(T* out, const T* in, int64_t n, const DropoutParams& p) {
  using A = compute_t<T>;
  const CounterRng rng{p.seed, p.stream};
  const A keep_scale = A(1) / (A(1) - A(p.p));
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = p.p == 0.0f || dropout_keep(rng, p.offset + uint64_t(i), p.p);
    out[i] = store<T>(load(in[i]) * (keep ? keep_scale : A(0)));
  }
}

void dropout_apply(Tensor& out, const Tensor& in, const DropoutParams& p, const char* out_name, const char* in_name) {
  check_defined(in, in_name);
  check_cpu(in, in_name);
  check_cpu(out, out_name);
  check_shape(out, in.shape(), out_name);
  check_dtype(out, in.dtype(), out_name);
  MEGATRON_CHECK(p.p >= 0.0f && p.p < 1.0f, "dropout probability " << p.p << " must be in [0, 1)");
  dispatch_floating(in.dtype(), "dropout", [&]<class T>(std::type_identity<T>) {
    dropout_kernel<T>(out.data<T>(), in.data<T>(), in.numel(), p);
  });
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::dropout_forward(Tensor& y, const Tensor& x, const DropoutParams& params) {
  dropout_apply(y, x, params, "dropout y", "dropout x");
}

// dx = dy * mask / (1-p): the same mask and scale as forward.
void cpu::dropout_backward(Tensor& dx, const Tensor& dy, const DropoutParams& params) {
  dropout_apply(dx, dy, params, "dropout dx", "dropout dy");
}

}  // namespace megatron::ops
