// GEMM and the linear layer on the CPU: OpenBLAS sgemm/dgemm. bf16 and f16 operands are widened to
// float copies first (the reference favours clarity over memory), the product is accumulated in
// float and rounded to the 16-bit output once at the end. f64 runs through dgemm for the gradient
// checks. The GELU-fused variants apply the activation (or its derivative) to that float/double
// accumulator before rounding, as the CUDA epilogues do.
#include "megatron/ops/gemm.h"

#include <cblas.h>

#include <limits>
#include <vector>

#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/checks/gemm.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/cpu/gelu.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

blasint blas_dim(int64_t n) {
  MEGATRON_CHECK(n <= std::numeric_limits<blasint>::max(),
                 "GEMM dimension " << n << " exceeds the BLAS integer range; split the product");
  return blasint(n < 1 ? 1 : n);  // leading dimensions must be >= 1 even for empty operands
}

// Row-major C (M,N) = alpha op(A) op(B) + beta C, op(A) (M,K), op(B) (K,N).
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
               float beta, float* c) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, a, blas_dim(ta ? m : k), b, blas_dim(tb ? k : n), beta, c, blas_dim(n));
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, const double* b,
               double beta, double* c) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, a, blas_dim(ta ? m : k), b, blas_dim(tb ? k : n), beta, c, blas_dim(n));
}

// dst[i] = src[i] converted to C, for a tensor of any floating dtype.
template <class C>
void widen(const Tensor& src, C* dst) {
  dispatch_floating(src.dtype(), "widen", [&]<class T>(std::type_identity<T>) {
    const T* s = src.data<T>();
    const int64_t n = src.numel();
#pragma omp parallel for if (worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) dst[i] = C(load(s[i]));
  });
}

template <class C>
void narrow(const C* src, Tensor& dst) {
  dispatch_floating(dst.dtype(), "narrow", [&]<class T>(std::type_identity<T>) {
    T* d = dst.data<T>();
    const int64_t n = dst.numel();
#pragma omp parallel for if (worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) d[i] = store<T>(compute_t<T>(src[i]));
  });
}

// A read-only operand as C*: the tensor's own memory when it holds C, else a widened copy.
template <class C>
class Operand {
 public:
  explicit Operand(const Tensor& t) {
    if (t.dtype() == dtype_of<C>()) {
      ptr_ = t.data<C>();
    } else {
      copy_.resize(size_t(t.numel()));
      widen(t, copy_.data());
      ptr_ = copy_.data();
    }
  }
  const C* data() const { return ptr_; }

 private:
  std::vector<C> copy_;
  const C* ptr_ = nullptr;
};

// An output as C*: the tensor's own memory when it holds C, else a C copy (holding the old
// contents when keep is true) that finish() rounds back into the tensor.
template <class C>
class Output {
 public:
  Output(Tensor& t, bool keep) : tensor_(t) {
    if (t.dtype() == dtype_of<C>()) {
      ptr_ = t.data<C>();
    } else {
      copy_.assign(size_t(t.numel()), C(0));
      if (keep) widen(t, copy_.data());
      ptr_ = copy_.data();
    }
  }
  C* data() { return ptr_; }
  void finish() {
    if (!copy_.empty()) narrow(copy_.data(), tensor_);
  }

 private:
  Tensor& tensor_;
  std::vector<C> copy_;
  C* ptr_ = nullptr;
};

// The operand dtypes the CPU computes in; the shared checks (ops/checks/gemm.h) own every other rule.
void check_cpu_gemm_dtype(const Tensor& t, const char* name) {
  MEGATRON_CHECK(
      t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16 || t.dtype() == DType::f64,
      name << " has dtype " << dtype_name(t.dtype()) << "; GEMM takes f32, bf16, f16 or f64");
}

constexpr checks::GemmBackend kCpuGemm{check_cpu, check_cpu_gemm_dtype};

// An FP8 operand's values times its scale_inv, exactly, in double (an FP8 value has 4 significant
// bits and scale_invs are f32: their product fits a double's 53).
std::vector<double> dequantized(const Tensor& t, const Tensor& scale_inv) {
  const double s = double(scale_inv.data<float>()[0]);
  std::vector<double> v(size_t(t.numel()));
  const auto* bits = static_cast<const uint8_t*>(t.raw());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = s * double(t.dtype() == DType::e4m3 ? fp8_e4m3::to_float(bits[i]) : fp8_e5m2::to_float(bits[i]));
  return v;
}

// A blockwise-scaled FP8 operand (rows, cols) dequantised exactly in double: each value times its
// block's scale_inv (ops/fp8.h's layout).
std::vector<double> dequantized_blocks(const Tensor& t, const Tensor& scale_inv, Fp8BlockShape blocks) {
  const int64_t rows = t.dim(0), cols = t.dim(1), ld = scale_inv.dim(1);
  const float* s = scale_inv.data<float>();
  const auto* bits = static_cast<const uint8_t*>(t.raw());
  std::vector<double> v(size_t(t.numel()));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t cb = c / kFp8BlockSize;
      const float block_scale_inv =
          blocks == Fp8BlockShape::tile_1x128 ? s[cb * ld + r] : s[(r / kFp8BlockSize) * ld + cb];
      const uint8_t code = bits[r * cols + c];
      const float value = t.dtype() == DType::e4m3 ? fp8_e4m3::to_float(code) : fp8_e5m2::to_float(code);
      v[size_t(r * cols + c)] = double(block_scale_inv) * double(value);
    }
  return v;
}

// C (M,N) = alpha op(A) op(B) + beta C in C = float or double.
template <class C>
void matmul_impl(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 const MatmulParams& p) {
  const Operand<C> A(a), B(b);
  Output<C> out(c, p.beta != 0.0f);
  blas_gemm(ta, tb, m, n, k, C(p.alpha), A.data(), B.data(), C(p.beta), out.data());
  out.finish();
}

// y (N,out) = x (N,in) W^T + bias in C: the accumulator starts as the bias rows, so a 16-bit
// result rounds once.
template <class C>
void linear_accumulate(C* yp, const Tensor& x, const Tensor& w, const Tensor& bias, int64_t n, int64_t out_features,
                       int64_t in_features) {
  const Operand<C> X(x), W(w);
  if (bias.defined()) {
    const Operand<C> bias_c(bias);
    const C* bp = bias_c.data();
#pragma omp parallel for if (worth_parallel(n * out_features))
    for (int64_t row = 0; row < n; ++row)
      for (int64_t o = 0; o < out_features; ++o) yp[row * out_features + o] = bp[o];
  }
  blas_gemm(false, true, n, out_features, in_features, C(1), X.data(), W.data(), C(bias.defined() ? 1 : 0), yp);
}

template <class C>
void linear_forward_impl(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias, int64_t n,
                         int64_t out_features, int64_t in_features) {
  Output<C> Y(y, false);
  linear_accumulate(Y.data(), x, w, bias, n, out_features, in_features);
  Y.finish();
}

// pre = x W^T + bias and y = gelu(pre), both from the C accumulator, each rounded once.
template <class C>
void linear_gelu_forward_impl(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& bias, int64_t n,
                              int64_t out_features, int64_t in_features) {
  Output<C> P(pre, false);
  linear_accumulate(P.data(), x, w, bias, n, out_features, in_features);
  const C* pp = P.data();
  dispatch_floating(y.dtype(), "linear_gelu_forward", [&]<class T>(std::type_identity<T>) {
    T* yp = y.data<T>();
    const int64_t count = n * out_features;
#pragma omp parallel for if (worth_parallel(count))
    for (int64_t i = 0; i < count; ++i) yp[i] = store<T>(compute_t<T>(gelu(pp[i])));
  });
  P.finish();
}

template <class C>
void linear_backward_impl(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                          int64_t n, int64_t out_features, int64_t in_features) {
  if (!dx.defined() && !dw.defined()) return;
  const Operand<C> DY(dy);
  if (dx.defined()) {
    // dx (N,in) = dy (N,out) @ W (out,in)
    const Operand<C> W(w);
    Output<C> DX(dx, false);
    blas_gemm(false, false, n, in_features, out_features, C(1), DY.data(), W.data(), C(0), DX.data());
    DX.finish();
  }
  if (!dw.defined()) return;  // dx only (db needs dw: checked); x is not read
  // dW (out,in) += dy^T (out,N) @ x (N,in)
  const Operand<C> X(x);
  blas_gemm(true, false, out_features, in_features, n, C(1), DY.data(), X.data(), C(1), dw.data<C>());
  if (db.defined()) {
    // db[o] += sum over rows of dy[row, o]
    const C* dyp = DY.data();
    C* dbp = db.data<C>();
#pragma omp parallel for if (worth_parallel(n * out_features))
    for (int64_t o = 0; o < out_features; ++o) {
      C sum = 0;
      for (int64_t row = 0; row < n; ++row) sum += dyp[row * out_features + o];
      dbp[o] += sum;
    }
  }
}

// dpre = (dy W) * gelu'(pre) with dy W kept in C, then dW and db as linear_backward.
template <class C>
void gelu_linear_backward_impl(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& pre, int64_t n, int64_t out_features, int64_t in_features) {
  {
    const Operand<C> DY(dy), W(w);
    std::vector<C> dact(size_t(n * in_features), C(0));
    blas_gemm(false, false, n, in_features, out_features, C(1), DY.data(), W.data(), C(0), dact.data());
    dispatch_floating(dpre.dtype(), "gelu_linear_backward", [&]<class T>(std::type_identity<T>) {
      T* dp = dpre.data<T>();
      const T* pp = pre.data<T>();
      const int64_t count = n * in_features;
#pragma omp parallel for if (worth_parallel(count))
      for (int64_t i = 0; i < count; ++i) {
        const C g = C(gelu_grad(load(pp[i])));
        dp[i] = store<T>(compute_t<T>(dact[size_t(i)] * g));
      }
    });
  }
  Tensor no_dx;
  linear_backward_impl<C>(no_dx, dw, db, dy, x, w, n, out_features, in_features);
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& params) {
  const auto [m, n, k] = checks::check_matmul(c, a, b, params, kCpuGemm);
  const bool ta = params.trans_a == Transpose::yes, tb = params.trans_b == Transpose::yes;
  if (a.dtype() == DType::f64) {
    matmul_impl<double>(c, a, b, ta, tb, m, n, k, params);
  } else {
    matmul_impl<float>(c, a, b, ta, tb, m, n, k, params);
  }
}

// The FP8 GEMM emulated: exact FP8 values, products summed in f64 (at least as precise as the
// tensor cores' f32 accumulation), C rounded once.
void cpu::fp8_matmul(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                     const MatmulParams& params) {
  const auto [m, n, k] = checks::check_fp8_matmul(c, a, a_scale_inv, b, b_scale_inv, params, check_cpu);
  const std::vector<double> A = dequantized(a, a_scale_inv), B = dequantized(b, b_scale_inv);
  Output<double> out(c, params.beta != 0.0f);
  blas_gemm(params.trans_a == Transpose::yes, params.trans_b == Transpose::yes, m, n, k, double(params.alpha), A.data(),
            B.data(), double(params.beta), out.data());
  out.finish();
}

// The block-scaled FP8 GEMM emulated as fp8_matmul: exact dequantised values, f64 sums, C rounded once.
void cpu::fp8_matmul_blockwise(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, Fp8BlockShape a_blocks,
                               const Tensor& b, const Tensor& b_scale_inv, Fp8BlockShape b_blocks,
                               const MatmulParams& params) {
  const auto [m, n, k] =
      checks::check_fp8_matmul_blockwise(c, a, a_scale_inv, a_blocks, b, b_scale_inv, b_blocks, params, check_cpu);
  const std::vector<double> A = dequantized_blocks(a, a_scale_inv, a_blocks);
  const std::vector<double> B = dequantized_blocks(b, b_scale_inv, b_blocks);
  Output<double> out(c, params.beta != 0.0f);
  blas_gemm(false, true, m, n, k, double(params.alpha), A.data(), B.data(), double(params.beta), out.data());
  out.finish();
}

void cpu::linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const auto [n, out_features, in_features] = checks::check_linear_forward(y, x, weight, bias, kCpuGemm);
  if (x.dtype() == DType::f64) {
    linear_forward_impl<double>(y, x, weight, bias, n, out_features, in_features);
  } else {
    linear_forward_impl<float>(y, x, weight, bias, n, out_features, in_features);
  }
}

void cpu::linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                          const Tensor& weight, GradWrite dweight_write) {
  const auto [n, out_features, in_features] =
      checks::check_linear_backward(dx, dweight, dbias, dy, x, weight, kCpuGemm);
  if (dweight_write == GradWrite::overwrite && dweight.defined()) dweight.zero();  // then the same sums
  if (x.dtype() == DType::f64) {
    linear_backward_impl<double>(dx, dweight, dbias, dy, x, weight, n, out_features, in_features);
  } else {
    linear_backward_impl<float>(dx, dweight, dbias, dy, x, weight, n, out_features, in_features);
  }
}

void cpu::linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const auto [n, out_features, in_features] = checks::check_linear_gelu_forward(y, pre, x, weight, bias, kCpuGemm);
  if (x.dtype() == DType::f64) {
    linear_gelu_forward_impl<double>(y, pre, x, weight, bias, n, out_features, in_features);
  } else {
    linear_gelu_forward_impl<float>(y, pre, x, weight, bias, n, out_features, in_features);
  }
}

void cpu::gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                               const Tensor& weight, const Tensor& pre, GradWrite dweight_write) {
  const auto [n, out_features, in_features] =
      checks::check_gelu_linear_backward(dpre, dweight, dbias, dy, x, weight, pre, kCpuGemm);
  if (dweight_write == GradWrite::overwrite && dweight.defined()) dweight.zero();
  if (x.dtype() == DType::f64) {
    gelu_linear_backward_impl<double>(dpre, dweight, dbias, dy, x, weight, pre, n, out_features, in_features);
  } else {
    gelu_linear_backward_impl<float>(dpre, dweight, dbias, dy, x, weight, pre, n, out_features, in_features);
  }
}

}  // namespace megatron::ops
