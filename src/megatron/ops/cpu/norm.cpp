// LayerNorm and RMSNorm on the CPU, one row of C channels at a time (llm.c layernorm_forward /
// layernorm_backward). RMSNorm is LayerNorm with the mean fixed at 0 and no bias, so one kernel
// serves both, and the fused residual add (add_norm_*) is the same kernel with its optional
// residual inputs given.
#include "megatron/ops/norm.h"

#include <cmath>

#include "megatron/ops/checks/norm.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

// y = (x - m) * rstd * w + b of one row, from its statistics.
template <class T>
void normalize_row(T* yr, const T* xr, const T* w, const T* b, compute_t<T> m, compute_t<T> s, int64_t C) {
  using A = compute_t<T>;
  for (int64_t c = 0; c < C; ++c) {
    const A bias = b != nullptr ? load(b[c]) : A(0);
    yr[c] = store<T>((load(xr[c]) - m) * s * load(w[c]) + bias);
  }
}

// With residual (and h) given, the row normalised is h = x + residual, rounded to T and stored
// first (add_norm_forward); otherwise x. y null: the statistics only.
template <class T>
void norm_forward_kernel(T* y, compute_t<T>* mean, compute_t<T>* rstd, const T* x, const T* w, const T* b, int64_t N,
                         int64_t C, bool rms, float eps, const T* residual, T* h) {
  using A = compute_t<T>;
#pragma omp parallel for if (worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    if (residual != nullptr) {
      T* hr = h + n * C;
      for (int64_t c = 0; c < C; ++c) hr[c] = store<T>(load(xr[c]) + load(residual[n * C + c]));
      xr = hr;
    }
    // m = mean(x) (0 for RMSNorm); var = mean((x - m)^2), which is mean(x^2) for RMSNorm
    A m = 0;
    if (!rms) {
      for (int64_t c = 0; c < C; ++c) m += load(xr[c]);
      m /= A(C);
    }
    A var = 0;
    for (int64_t c = 0; c < C; ++c) {
      const A d = load(xr[c]) - m;
      var += d * d;
    }
    var /= A(C);
    const A s = A(1) / std::sqrt(var + A(eps));
    if (y != nullptr) normalize_row(y + n * C, xr, w, b, m, s, C);
    if (mean != nullptr) mean[n] = m;
    rstd[n] = s;
  }
}

// dh, when given, is added to dx before rounding (add_norm_backward).
template <class T>
void norm_backward_kernel(T* dx, compute_t<T>* dw, compute_t<T>* db, const T* dy, const T* x, const T* w,
                          const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, const T* dh) {
  using A = compute_t<T>;
  const bool rms = mean == nullptr;
  // dx, row by row. With xhat = (x - m) rstd and g = dy * w:
  //   LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat))
  //   RMSNorm:   dx = rstd (g - xhat mean(g xhat))          (no mean was subtracted in forward)
  // plus dh, the gradient arriving along the residual stream, when given.
#pragma omp parallel for if (worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const A m = rms ? A(0) : mean[n], s = rstd[n];
    const T* xr = x + n * C;
    const T* dyr = dy + n * C;
    A g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const A g = load(dyr[c]) * load(w[c]);
      g_mean += g;
      gx_mean += g * (load(xr[c]) - m) * s;
    }
    g_mean = rms ? A(0) : g_mean / A(C);
    gx_mean /= A(C);
    for (int64_t c = 0; c < C; ++c) {
      const A g = load(dyr[c]) * load(w[c]);
      const A xhat = (load(xr[c]) - m) * s;
      const A skip = dh != nullptr ? load(dh[n * C + c]) : A(0);
      dx[n * C + c] = store<T>(s * (g - g_mean - xhat * gx_mean) + skip);
    }
  }
  // dw += sum_n dy xhat, db += sum_n dy: channel by channel, so threads never share an output.
#pragma omp parallel for if (worth_parallel(N * C))
  for (int64_t c = 0; c < C; ++c) {
    A dw_sum = 0, db_sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const A g = load(dy[n * C + c]);
      dw_sum += g * (load(x[n * C + c]) - (rms ? A(0) : mean[n])) * rstd[n];
      db_sum += g;
    }
    dw[c] += dw_sum;
    if (db != nullptr) db[c] += db_sum;
  }
}

// Optional tensors as pointers (nullptr when undefined).
template <class T>
T* data_or_null(Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// CPU kernels exist for the dtypes dispatch_floating takes.
void check_cpu_norm_dtype(const Tensor& x, const char* op) {
  dispatch_floating(x.dtype(), op, []<class T>(std::type_identity<T>) {});
}

constexpr checks::NormBackend kCpuNorm{check_cpu, check_cpu_norm_dtype};

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const NormParams& params) {
  const checks::NormDims dims = checks::check_norm_forward(y, mean, rstd, x, weight, bias, params, kCpuNorm);
  const int64_t N = dims.rows, C = dims.channels;
  dispatch_floating(x.dtype(), "norm_forward", [&]<class T>(std::type_identity<T>) {
    norm_forward_kernel<T>(data_or_null<T>(y), data_or_null<compute_t<T>>(mean), rstd.data<compute_t<T>>(), x.data<T>(),
                           weight.data<T>(), data_or_null<T>(bias), N, C, params.kind == NormKind::rmsnorm, params.eps,
                           nullptr, nullptr);
  });
}

void cpu::norm_forward_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& weight,
                           const Tensor& bias, const Tensor& mean, const Tensor& rstd, const NormParams& params,
                           const Tensor& scale) {
  const checks::NormDims dims =
      checks::check_norm_forward_fp8(q, q_t, amax, x, weight, bias, mean, rstd, params, scale, kCpuNorm);
  const int64_t N = dims.rows, C = dims.channels;
  Tensor y = Tensor::empty({N, C}, x.dtype());
  dispatch_floating(x.dtype(), "norm_forward_fp8", [&]<class T>(std::type_identity<T>) {
    const auto* m = data_or_null<compute_t<T>>(mean);
    const auto* s = rstd.data<compute_t<T>>();
#pragma omp parallel for if (worth_parallel(N * C))
    for (int64_t n = 0; n < N; ++n)
      normalize_row(y.data<T>() + n * C, x.data<T>() + n * C, weight.data<T>(), data_or_null<T>(bias),
                    m != nullptr ? m[n] : compute_t<T>(0), s[n], C);
  });
  cpu::fp8_quantize_transpose(q, q_t, amax, y, scale);
}

void cpu::norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd, const NormParams& params) {
  const checks::NormDims dims =
      checks::check_norm_backward(dx, dweight, dbias, dy, x, weight, mean, rstd, params, kCpuNorm);
  const int64_t N = dims.rows, C = dims.channels;
  dispatch_floating(x.dtype(), "norm_backward", [&]<class T>(std::type_identity<T>) {
    norm_backward_kernel<T>(dx.data<T>(), dweight.data<compute_t<T>>(), data_or_null<compute_t<T>>(dbias), dy.data<T>(),
                            x.data<T>(), weight.data<T>(), data_or_null<compute_t<T>>(mean), rstd.data<compute_t<T>>(),
                            N, C, nullptr);
  });
}

void cpu::add_norm_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& residual,
                           const Tensor& weight, const Tensor& bias, const NormParams& params) {
  const checks::NormDims dims =
      checks::check_add_norm_forward(h, y, mean, rstd, x, residual, weight, bias, params, kCpuNorm);
  const int64_t N = dims.rows, C = dims.channels;
  dispatch_floating(x.dtype(), "add_norm_forward", [&]<class T>(std::type_identity<T>) {
    norm_forward_kernel<T>(data_or_null<T>(y), data_or_null<compute_t<T>>(mean), rstd.data<compute_t<T>>(), x.data<T>(),
                           weight.data<T>(), data_or_null<T>(bias), N, C, params.kind == NormKind::rmsnorm, params.eps,
                           residual.data<T>(), h.data<T>());
  });
}

void cpu::add_norm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& dh,
                            const Tensor& h, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                            const NormParams& params) {
  const checks::NormDims dims =
      checks::check_add_norm_backward(dx, dweight, dbias, dy, dh, h, weight, mean, rstd, params, kCpuNorm);
  const int64_t N = dims.rows, C = dims.channels;
  dispatch_floating(h.dtype(), "add_norm_backward", [&]<class T>(std::type_identity<T>) {
    norm_backward_kernel<T>(dx.data<T>(), dweight.data<compute_t<T>>(), data_or_null<compute_t<T>>(dbias), dy.data<T>(),
                            h.data<T>(), weight.data<T>(), data_or_null<compute_t<T>>(mean), rstd.data<compute_t<T>>(),
                            N, C, dh.data<T>());
  });
}

}  // namespace megatron::ops
