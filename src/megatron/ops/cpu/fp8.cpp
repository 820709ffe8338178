// The FP8 quantiser and the recipes' scale update on the CPU: the reference the CUDA kernels are
// held to bit for bit. Rounding is core/dtype.h's (nearest even on the FP8 grid, saturating).
#include "megatron/ops/checks/fp8.h"

#include <bit>
#include <cmath>

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

void check_cpu_floating(const Tensor& t, const char* name) {
  dispatch_floating(t.dtype(), name, []<class T>(std::type_identity<T>) {});
}

// max |x| with NaN above everything: the order of the magnitudes' bit patterns, which is the
// order of the values for non-negative floats and puts NaN (exponent all ones, mantissa non-zero)
// above infinity. The CUDA kernels reduce the same bit patterns with atomicMax.
uint32_t magnitude_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

template <class T>
uint32_t amax_bits(const T* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, magnitude_bits(float(load(x[i]))));
  return m;
}

void accumulate_amax(Tensor& amax, uint32_t bits) {
  float& a = amax.data<float>()[0];
  a = std::bit_cast<float>(std::max(magnitude_bits(a), bits));
}

template <class Q, class T>
void quantize(Q* q, const T* x, int64_t n, float scale) {
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) q[i] = Q(float(load(x[i])) * scale);  // one f32 product, then the rounding
}

// q_t (cols, rows) = the cast of x (rows, cols), transposed.
template <class Q, class T>
void quantize_transposed(Q* q_t, const T* x, int64_t rows, int64_t cols, float scale) {
#pragma omp parallel for if (worth_parallel(rows * cols))
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) q_t[c * rows + r] = Q(float(load(x[r * cols + c])) * scale);
}

}  // namespace

}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::fp8_amax(Tensor& amax, const Tensor& x) {
  checks::check_fp8_amax(amax, x, check_cpu, check_cpu_floating);
  dispatch_floating(x.dtype(), "fp8_amax",
                    [&]<class T>(std::type_identity<T>) { accumulate_amax(amax, amax_bits(x.data<T>(), x.numel())); });
}

void cpu::fp8_quantize(Tensor& q, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize(q, amax, x, scale, check_cpu, check_cpu_floating);
  const float s = scale.data<float>()[0];
  dispatch_floating(x.dtype(), "fp8_quantize", [&]<class T>(std::type_identity<T>) {
    if (q.dtype() == DType::e4m3)
      quantize(q.data<fp8_e4m3>(), x.data<T>(), x.numel(), s);
    else
      quantize(q.data<fp8_e5m2>(), x.data<T>(), x.numel(), s);
    if (amax.defined()) accumulate_amax(amax, amax_bits(x.data<T>(), x.numel()));
  });
}

void cpu::fp8_quantize_transpose(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize_transpose(q, q_t, amax, x, scale, check_cpu, check_cpu_floating);
  if (q.defined()) cpu::fp8_quantize(q, amax, x, scale);
  const float s = scale.data<float>()[0];
  const int64_t rows = x.dim(0), cols = x.dim(1);
  dispatch_floating(x.dtype(), "fp8_quantize_transpose", [&]<class T>(std::type_identity<T>) {
    if (q_t.dtype() == DType::e4m3)
      quantize_transposed(q_t.data<fp8_e4m3>(), x.data<T>(), rows, cols, s);
    else
      quantize_transposed(q_t.data<fp8_e5m2>(), x.data<T>(), rows, cols, s);
    if (amax.defined() && !q.defined()) accumulate_amax(amax, amax_bits(x.data<T>(), x.numel()));
  });
}

void cpu::fp8_update_scale(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype,
                           const Fp8Recipe& recipe) {
  checks::check_fp8_update_scale(scale, scale_inv, amax_history, fp8_dtype, recipe, check_cpu);
  float* history = amax_history.data<float>();
  const int64_t len = amax_history.numel();
  float amax = history[0];
  if (recipe.amax_compute_algo == AmaxComputeAlgo::max)
    for (int64_t i = 1; i < len; ++i)
      amax = std::bit_cast<float>(std::max(magnitude_bits(amax), magnitude_bits(history[i])));
  float& s = scale.data<float>()[0];
  // TE: sf = (fp8_max / amax) / 2^margin in f32, kept only where amax is finite and positive.
  if (std::isfinite(amax) && amax > 0.0f) s = (fp8_max(fp8_dtype) / amax) / std::ldexp(1.0f, int(recipe.margin));
  scale_inv.data<float>()[0] = 1.0f / s;
  // TE's roll by -1 (history[i] = history[i + 1], the first to the end), then history[0] = 0.
  const float first = history[0];
  for (int64_t i = 0; i + 1 < len; ++i) history[i] = history[i + 1];
  history[len - 1] = first;
  history[0] = 0.0f;
}

}  // namespace megatron::ops
