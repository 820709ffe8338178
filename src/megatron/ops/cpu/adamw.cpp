// AdamW on the CPU: one pass over the flat master / moment / grad buffers in float (double for
// f64 masters), then the compute copy is rounded from the updated master; masters kept as
// remainders are joined, updated and split in the one pass.
#include "megatron/ops/adamw.h"

#include <cmath>

#include "megatron/core/param_remainder.h"
#include "megatron/ops/checks/adamw.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

// Constants of one step in the masters' type. Bias corrections in double, as torch computes them on
// the host.
template <class A>
struct Constants {
  A lr, b1, b2, eps, wd, grad_scale, bc1, bc2;
  explicit Constants(const AdamWParams& p)
      : lr(A(p.lr)),
        b1(A(p.beta1)),
        b2(A(p.beta2)),
        eps(A(p.eps)),
        wd(A(p.weight_decay)),
        grad_scale(A(p.grad_scale)),
        bc1(A(1.0 - std::pow(double(p.beta1), double(p.step)))),
        bc2(A(1.0 - std::pow(double(p.beta2), double(p.step)))) {}
};

// One element: the moments in place; returns the updated master.
template <class A>
A adamw_update(A master, A& exp_avg, A& exp_avg_sq, A grad, const Constants<A>& c) {
  // g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  // p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p),  bc = 1 - beta^t
  const A g = grad * c.grad_scale;
  const A m = c.b1 * exp_avg + (A(1) - c.b1) * g;
  const A v = c.b2 * exp_avg_sq + (A(1) - c.b2) * g * g;
  exp_avg = m;
  exp_avg_sq = v;
  return master - c.lr * (m / c.bc1 / (std::sqrt(v / c.bc2) + c.eps) + c.wd * master);
}

template <class A>
void adamw_kernel(A* master, A* exp_avg, A* exp_avg_sq, const A* grad, int64_t n, const AdamWParams& p) {
  const Constants<A> c(p);
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) master[i] = adamw_update(master[i], exp_avg[i], exp_avg_sq[i], grad[i], c);
}

// Masters kept as remainders beside the bf16 parameters (core/param_remainder.h).
void adamw_remainder_kernel(uint16_t* remainder, bf16* param, float* exp_avg, float* exp_avg_sq, const float* grad,
                            int64_t n, const AdamWParams& p) {
  const Constants<float> c(p);
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float master = join_master_value(param[i].bits, remainder[i]);
    const SplitMaster updated = split_master(adamw_update(master, exp_avg[i], exp_avg_sq[i], grad[i], c));
    param[i].bits = updated.param;
    remainder[i] = updated.remainder;
  }
}

void check_cpu_master_dtype(const Tensor& master, const char* name) {
  MEGATRON_CHECK(master.dtype() == DType::f32 || master.dtype() == DType::f64 || master.dtype() == DType::u16,
                 name << " has dtype " << dtype_name(master.dtype())
                      << "; master weights are f32 (or f64), or u16 remainders of bf16 parameters");
}

void check_cpu_copy_dtype(const Tensor& copy, const char* name) {
  const DType d = copy.dtype();
  MEGATRON_CHECK(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16,
                 name << " has dtype " << dtype_name(d) << "; the CPU writes f32, f64, bf16 or f16 copies");
}

constexpr checks::AdamWBackend kCpuAdamW{check_cpu, check_cpu_master_dtype, check_cpu_copy_dtype};

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::adamw_step(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& model_param,
                     const AdamWParams& params) {
  checks::check_adamw_step(master, exp_avg, exp_avg_sq, grad, model_param, params, kCpuAdamW);
  const bool remainders = master.dtype() == DType::u16;
  if (remainders) {
    adamw_remainder_kernel(master.data<uint16_t>(), model_param.data<bf16>(), exp_avg.data<float>(),
                           exp_avg_sq.data<float>(), grad.data<float>(), master.numel(), params);
    return;
  }
  if (master.dtype() == DType::f64) {
    adamw_kernel<double>(master.data<double>(), exp_avg.data<double>(), exp_avg_sq.data<double>(), grad.data<double>(),
                         master.numel(), params);
  } else {
    adamw_kernel<float>(master.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), grad.data<float>(),
                        master.numel(), params);
  }
  if (model_param.defined()) cast(model_param, master);
}

void cpu::adamw_step_pieces(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, std::vector<AdamWPiece>& pieces,
                            const AdamWParams& params) {
  checks::check_adamw_step_pieces(master, exp_avg, exp_avg_sq, pieces, params, kCpuAdamW);
  for (const AdamWPiece& piece : pieces) {
    const int64_t end = piece.begin + piece.grad.numel();
    Tensor m = exp_avg.slice(piece.begin, end), v = exp_avg_sq.slice(piece.begin, end);
    Tensor model = piece.model_param, none;
    Tensor masters = master.defined() ? master.slice(piece.begin, end) : model;
    AdamWParams own = params;
    own.weight_decay = piece.weight_decay;
    adamw_step(masters, m, v, piece.grad, master.defined() ? model : none, own);
  }
}

void cpu::adamw_step_fp8(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& codes,
                         Tensor& codes_amax, const Tensor& codes_scale, const AdamWParams& params) {
  checks::check_adamw_step_fp8(master, exp_avg, exp_avg_sq, grad, codes, codes_amax, codes_scale, params, kCpuAdamW);
  // The update, then the cast: the reference the one-pass CUDA kernel must equal byte for byte.
  Tensor no_model;
  adamw_step(master, exp_avg, exp_avg_sq, grad, no_model, params);
  fp8_quantize(codes, codes_amax, master, codes_scale);
}

}  // namespace megatron::ops
