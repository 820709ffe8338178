// AdamW on CUDA: one pass over the flat f32 master / moment / grad buffers, 4 elements per thread
// step through 16-byte accesses when every buffer is 16-byte aligned, writing the compute copy
// (bf16 / f32 / f16) from the updated master in the same pass, so no second kernel reads the
// master again. The update is written in the reference's order with explicit rounding and IEEE
// division and square root, so it rounds as the CPU does (no fused multiply-adds).
#include <cmath>

#include "megatron/ops/adamw.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

constexpr int kVec = 4;  // one 16-byte access of the f32 buffers

struct AdamWConstants {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

// Updates element i in place; returns the new master value.
__device__ __forceinline__ float adamw_update(float& master, float& m, float& v, float grad, const AdamWConstants& c) {
  // g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  // p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(__fsub_rn(1.0f, c.beta1), g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, c.beta2), g), g));
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, c.bias_correction2)), c.eps);
  const float step = __fadd_rn(__fdiv_rn(__fdiv_rn(m, c.bias_correction1), denom), __fmul_rn(c.weight_decay, master));
  master = __fsub_rn(master, __fmul_rn(c.lr, step));
  return master;
}

// P is the compute copy's type; write_model is false when there is none (model_param undefined).
template <bool kVector, bool kWriteModel, class P>
__global__ void adamw_kernel(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, P* model, int64_t n,
                             AdamWConstants c) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    const int64_t chunks = n / kVec;
    for (int64_t k = tid; k < chunks; k += stride) {
      const int64_t i = k * kVec;
      float p[kVec], m[kVec], v[kVec], g[kVec];
      load_floats<kVec>(master + i, p);
      load_floats<kVec>(exp_avg + i, m);
      load_floats<kVec>(exp_avg_sq + i, v);
      load_floats<kVec>(grad + i, g);
#pragma unroll
      for (int j = 0; j < kVec; ++j) adamw_update(p[j], m[j], v[j], g[j], c);
      store_floats<kVec>(master + i, p);
      store_floats<kVec>(exp_avg + i, m);
      store_floats<kVec>(exp_avg_sq + i, v);
      if constexpr (kWriteModel) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) model[i + j] = from_float<P>(p[j]);
      }
    }
    done = chunks * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    const float p = adamw_update(master[i], exp_avg[i], exp_avg_sq[i], grad[i], c);
    if constexpr (kWriteModel) model[i] = from_float<P>(p);
  }
}

template <bool kWriteModel, class P>
void launch_adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, P* model, int64_t n,
                  const AdamWConstants& c) {
  if (n == 0) return;
  const bool vector = is_aligned16(master) && is_aligned16(exp_avg) && is_aligned16(exp_avg_sq) && is_aligned16(grad);
  if (vector) {
    adamw_kernel<true, kWriteModel>
        <<<grid_for(ceil_div(n, kVec)), kThreads, 0, stream()>>>(master, exp_avg, exp_avg_sq, grad, model, n, c);
  } else {
    adamw_kernel<false, kWriteModel>
        <<<grid_for(n), kThreads, 0, stream()>>>(master, exp_avg, exp_avg_sq, grad, model, n, c);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::adamw_step(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& model_param,
                      const AdamWParams& params) {
  check_cuda(master, "adamw master");
  MEGATRON_CHECK(master.dtype() == DType::f32,
                 "adamw master has dtype " << dtype_name(master.dtype()) << "; master weights on CUDA are f32");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&exp_avg, "adamw exp_avg"},
                                {&exp_avg_sq, "adamw exp_avg_sq"},
                                {&grad, "adamw grad"}}) {
    check_cuda(*t, name);
    check_numel(*t, master.numel(), name);
    check_dtype(*t, DType::f32, name);
  }
  if (model_param.defined()) {
    check_cuda(model_param, "adamw model_param");
    check_numel(model_param, master.numel(), "adamw model_param");
  }
  MEGATRON_CHECK(params.step >= 1, "adamw step " << params.step << " must be >= 1 (steps count from 1)");
  MEGATRON_CHECK(params.beta1 >= 0.0f && params.beta1 < 1.0f && params.beta2 >= 0.0f && params.beta2 < 1.0f,
                 "adamw betas (" << params.beta1 << ", " << params.beta2 << ") must be in [0, 1)");
  // Bias corrections in double on the host, as torch and the CPU reference compute them.
  const AdamWConstants c{params.lr,
                         params.beta1,
                         params.beta2,
                         params.eps,
                         params.weight_decay,
                         params.grad_scale,
                         float(1.0 - std::pow(double(params.beta1), double(params.step))),
                         float(1.0 - std::pow(double(params.beta2), double(params.step)))};
  float* p = device_data<float>(master);
  float* m = device_data<float>(exp_avg);
  float* v = device_data<float>(exp_avg_sq);
  const float* g = device_data<float>(grad);
  const int64_t n = master.numel();
  if (!model_param.defined()) return launch_adamw<false>(p, m, v, g, static_cast<float*>(nullptr), n, c);
  dispatch_storage(model_param.dtype(), "adamw model_param", [&]<class P>(std::type_identity<P>) {
    launch_adamw<true>(p, m, v, g, device_data<P>(model_param), n, c);
  });
}

}  // namespace megatron::ops
