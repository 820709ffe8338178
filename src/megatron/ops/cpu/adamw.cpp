// AdamW on the CPU: one pass over the flat master / moment / grad buffers in float (double for
// f64 masters), then the compute copy is rounded from the updated master.
#include "megatron/ops/adamw.h"

#include <cmath>

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/elementwise.h"

namespace megatron::ops::cpu {
namespace {

template <class A>
void adamw_kernel(A* master, A* exp_avg, A* exp_avg_sq, const A* grad, int64_t n, const AdamWParams& p) {
  // Bias corrections in double, as torch computes them on the host.
  const A bc1 = A(1.0 - std::pow(double(p.beta1), double(p.step)));
  const A bc2 = A(1.0 - std::pow(double(p.beta2), double(p.step)));
  const A lr = A(p.lr), b1 = A(p.beta1), b2 = A(p.beta2), eps = A(p.eps), wd = A(p.weight_decay);
  const A grad_scale = A(p.grad_scale);
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    // g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    // p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p),  bc = 1 - beta^t
    const A g = grad[i] * grad_scale;
    const A m = b1 * exp_avg[i] + (A(1) - b1) * g;
    const A v = b2 * exp_avg_sq[i] + (A(1) - b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] -= lr * (m / bc1 / (std::sqrt(v / bc2) + eps) + wd * master[i]);
  }
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::adamw_step(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& model_param,
                     const AdamWParams& params) {
  check_defined(master, "adamw master");
  check_cpu(master, "adamw master");
  MEGATRON_CHECK(master.dtype() == DType::f32 || master.dtype() == DType::f64,
                 "adamw master has dtype " << dtype_name(master.dtype()) << "; master weights are f32 (or f64)");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&exp_avg, "adamw exp_avg"},
                                {&exp_avg_sq, "adamw exp_avg_sq"},
                                {&grad, "adamw grad"}}) {
    check_cpu(*t, name);
    check_numel(*t, master.numel(), name);
    check_dtype(*t, master.dtype(), name);
  }
  if (model_param.defined()) {
    check_cpu(model_param, "adamw model_param");
    check_numel(model_param, master.numel(), "adamw model_param");
  }
  MEGATRON_CHECK(params.step >= 1, "adamw step " << params.step << " must be >= 1 (steps count from 1)");
  MEGATRON_CHECK(params.beta1 >= 0.0f && params.beta1 < 1.0f && params.beta2 >= 0.0f && params.beta2 < 1.0f,
                 "adamw betas (" << params.beta1 << ", " << params.beta2 << ") must be in [0, 1)");
  if (master.dtype() == DType::f64) {
    adamw_kernel<double>(master.data<double>(), exp_avg.data<double>(), exp_avg_sq.data<double>(), grad.data<double>(),
                         master.numel(), params);
  } else {
    adamw_kernel<float>(master.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), grad.data<float>(),
                        master.numel(), params);
  }
  if (model_param.defined()) cast(model_param, master);
}

}  // namespace megatron::ops
