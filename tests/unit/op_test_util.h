#pragma once
// Shared helpers for the op tests (tests/unit/test_ops_*.cpp), in the spirit of ggml's
// test-backend-ops: deterministic inputs, NaN-poisoned outputs, elementwise tolerances derived
// from the dtype's unit roundoff times a per-op factor, and central finite differences in f64.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>

#include "megatron/core/dtype.h"
#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"

namespace megatron::test {

// Unit roundoff u = 2^-p for a p-bit significand: the largest relative error of one rounding.
constexpr double kUnitRoundoffF32 = 0x1p-24;
constexpr double kUnitRoundoffBf16 = 0x1p-8;
constexpr double kUnitRoundoffF16 = 0x1p-11;

inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return kUnitRoundoffF32;
    case DType::bf16:
      return kUnitRoundoffBf16;
    case DType::f16:
      return kUnitRoundoffF16;
    case DType::f64:
      return 0x1p-53;
    default:
      ADD_FAILURE() << "no unit roundoff for " << dtype_name(dtype);
      return 1.0;
  }
}

// N(0,1) * scale from CounterRng{seed}, rounded through bf16 so the same values are exact in bf16,
// f32 and f64, and in f16 too unless below 2^-17 or above 65504 in magnitude (8 significant bits
// fit f16's 11 down to its subnormal spacing 2^-24): precision comparisons then measure the op's
// arithmetic, not input rounding.
inline Tensor randn(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  const CounterRng rng{seed, stream_id("op_test")};
  for (int64_t i = 0; i < t.numel(); ++i) t.set_item(i, double(round_to_bf16(float(scale * rng.normal(uint64_t(i))))));
  return t;
}

inline Tensor filled(const Shape& shape, DType dtype, double value) {
  Tensor t = Tensor::empty(shape, dtype);
  t.fill(value);
  return t;
}

// Outputs start as NaN, so an element the op forgets to write shows up in expect_all_finite.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  return filled(shape, dtype, std::numeric_limits<double>::quiet_NaN());
}

inline ::testing::AssertionResult all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.item(i))) return ::testing::AssertionFailure() << "element " << i << " is " << t.item(i);
  }
  return ::testing::AssertionSuccess();
}

inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.item(i)));
  return m;
}

// sum_i a_i b_i in double: the scalar loss L = sum(out * R) of the gradient checks.
inline double sum_product(const Tensor& a, const Tensor& b) {
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item(i) * b.item(i);
  return s;
}

// Every element: |actual - expected| <= rtol |expected| + atol. NaN anywhere fails.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.numel() != expected.numel()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.numel() << " vs " << expected.numel();
  }
  double worst = -1.0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = actual.item(i), e = expected.item(i);
    const double excess = std::fabs(a - e) - (rtol * std::fabs(e) + atol);
    if (!(excess <= 0.0) && (worst_i < 0 || !(excess <= worst))) {  // NaN counts as the worst
      worst = excess;
      worst_i = i;
    }
  }
  if (worst_i < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << ": " << actual.item(worst_i) << " vs expected "
                                       << expected.item(worst_i) << " (rtol " << rtol << ", atol " << atol << ")";
}

// A lower-precision result against the f64 reference run on the same (exactly representable)
// inputs: |a - r| <= factor u (|r| + max|r|). The max|r| term admits errors that scale with the
// operands rather than with the element (cancellation in sums). factor is written in each test.
inline ::testing::AssertionResult matches_reference(const Tensor& actual, const Tensor& ref, double unit_roundoff,
                                                    double factor) {
  const double tol = factor * unit_roundoff;
  return all_close(actual, ref, tol, tol * max_abs(ref));
}

// dL/dx by central differences, x an f64 tensor that loss() reads:
//   g_i = (L(x + h e_i) - L(x - h e_i)) / 2h,  h = 1e-6 max(1, |x_i|).
// Truncation error is h^2 |L'''| / 6 ~ 1e-13 and roundoff eps |L| / h ~ 1e-16 * 10 / 1e-6 = 1e-9
// for these O(1)-sized losses, both far below the 1e-6 tolerance of grad_close.
inline Tensor numeric_grad(Tensor& x, const std::function<double()>& loss) {
  EXPECT_EQ(x.dtype(), DType::f64) << "finite differences need f64 inputs";
  Tensor g = Tensor::zeros(x.shape(), DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.item(i);
    const double h = 1e-6 * std::max(1.0, std::fabs(v));
    x.set_item(i, v + h);
    const double plus = loss();
    x.set_item(i, v - h);
    const double minus = loss();
    x.set_item(i, v);
    g.set_item(i, (plus - minus) / (2.0 * h));
  }
  return g;
}

// Analytic against numeric gradient: |a - n| <= 1e-6 (|n| + max|n|). A missing or wrong term is an
// O(1) relative error; finite-difference error is ~1e-9 (numeric_grad), so 1e-6 separates them.
inline ::testing::AssertionResult grad_close(const Tensor& analytic, const Tensor& numeric) {
  return matches_reference(analytic, numeric, 1e-6, 1.0);
}

// Runs fn with n OpenMP threads, then restores the previous count. Kernels split work by rows, so
// results must be bitwise the same for any n; small shapes stay serial (ops/cpu worth_parallel), so
// these comparisons use shapes large enough to take the parallel path.
template <class F>
void with_threads(int n, F&& fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(before);
}

// fn() throws megatron::Error whose message contains needle (the tensor or value it names).
template <class F>
::testing::AssertionResult throws_error_naming(F&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "error does not mention '" << needle << "': " << e.what();
  }
  return ::testing::AssertionFailure() << "no megatron::Error thrown";
}

}  // namespace megatron::test
