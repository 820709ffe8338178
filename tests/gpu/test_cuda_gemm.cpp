// GEMM and the linear layer on CUDA against the CPU op run in f64 on the same (bf16-exact) values.
//
// Error bound, elementwise, for an output that sums K products (no tuned tolerances):
//   E = 2 (K + 2) u32 S,  S = the same op on absolute values (|alpha| |op(A)| |op(B)| + |beta| |C|,
//   computed by the CPU op on |inputs|): the textbook gamma_K bound of a K-term dot product plus
//   the alpha/beta scalings, doubled because tensor cores may truncate rather than round while
//   accumulating (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021).
//   A 16-bit (bf16/f16) output is that result rounded once more: E (1 + u) + u |ref|, u its unit roundoff.
// For f32 operands this bound is ~1000x tighter than TF32's 2^-11 rounding, so it also checks
// that f32 GEMMs run in full FP32.
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/activation.h"
#include "megatron/ops/gemm.h"

using namespace megatron;
using namespace megatron::test;
using ops::MatmulParams;
using ops::Transpose;

namespace {

class CudaGemm : public CudaTest {};

Tensor dot_bound(const Tensor& abs_result, const Tensor& ref, int64_t k, DType out_dtype) {
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  const double u = out_dtype == DType::f32 ? 0.0 : unit_roundoff(out_dtype);  // the final 16-bit rounding
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = 2.0 * double(k + 2) * kUnitRoundoffF32 * abs_result.item(i);
    bound.set_item(i, e * (1.0 + u) + u * std::fabs(ref.item(i)));
  }
  return bound;
}

Tensor zeros64(const Shape& shape) { return Tensor::zeros(shape, DType::f64); }

struct MatmulCase {
  DType in, out;
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  int64_t misalign;
};

::testing::AssertionResult run_matmul(const MatmulCase& c, uint64_t seed) {
  const Shape a_shape = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
  const Shape b_shape = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
  Pair a = random_pair(a_shape, c.in, seed, 1.0, c.misalign);
  Pair b = random_pair(b_shape, c.in, seed + 1);
  // beta = 0 must not read C: it starts as NaN then.
  Pair out = c.beta == 0.0f ? poisoned_pair({c.m, c.n}, c.out) : random_pair({c.m, c.n}, c.out, seed + 2);
  const MatmulParams p{c.ta ? Transpose::yes : Transpose::no, c.tb ? Transpose::yes : Transpose::no, c.alpha, c.beta};
  Tensor ref = f64(out.cpu);
  ops::cpu::matmul(ref, f64(a.cpu), f64(b.cpu), p);
  Tensor abs_result = c.beta == 0.0f ? zeros64({c.m, c.n}) : abs_f64(out.cpu);
  ops::cpu::matmul(abs_result, abs_f64(a.cpu), abs_f64(b.cpu),
                   {p.trans_a, p.trans_b, std::fabs(c.alpha), std::fabs(c.beta)});
  ops::cuda::matmul(out.gpu, a.gpu, b.gpu, p);
  return within_bound(out, ref, dot_bound(abs_result, ref, c.k, c.out))
         << " (matmul " << dtype_name(c.in) << "->" << dtype_name(c.out) << " " << c.m << "x" << c.n << "x" << c.k
         << " trans " << c.ta << c.tb << " alpha " << c.alpha << " beta " << c.beta << " misalign " << c.misalign
         << ")";
}

}  // namespace

TEST_F(CudaGemm, MatmulAllTransposesDtypesAndScalings) {
  const struct {
    DType in, out;
  } dtypes[] = {{DType::f32, DType::f32},
                {DType::bf16, DType::bf16},
                {DType::bf16, DType::f32},
                {DType::f16, DType::f16},
                {DType::f16, DType::f32}};
  const int64_t shapes[][3] = {{1, 1, 1}, {13, 7, 5}, {64, 48, 32}, {127, 65, 33}};
  uint64_t seed = 100;
  for (const auto& d : dtypes) {
    for (int t = 0; t < 4; ++t) {
      for (const auto& s : shapes) {
        for (const float beta : {0.0f, 0.5f}) {
          const MatmulCase c{d.in, d.out, (t & 1) != 0, (t & 2) != 0, s[0], s[1], s[2], 0.75f, beta, 0};
          EXPECT_TRUE(run_matmul(c, seed += 3));
        }
      }
    }
  }
}

TEST_F(CudaGemm, MatmulLargerShapes) {
  EXPECT_TRUE(run_matmul({DType::bf16, DType::bf16, false, true, 256, 512, 384, 1.0f, 0.0f, 0}, 7));
  EXPECT_TRUE(run_matmul({DType::bf16, DType::f32, true, false, 384, 256, 512, 1.0f, 1.0f, 0}, 8));
  EXPECT_TRUE(run_matmul({DType::f32, DType::f32, false, false, 200, 300, 400, 1.0f, 0.0f, 0}, 9));
  EXPECT_TRUE(run_matmul({DType::f16, DType::f32, true, false, 384, 256, 512, 1.0f, 1.0f, 0}, 10));
}

TEST_F(CudaGemm, MatmulOperandsOffSixteenByteAlignment) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_TRUE(run_matmul({dtype, dtype, false, true, 24, 40, 16, 1.0f, 0.0f, 1}, 21));
    EXPECT_TRUE(run_matmul({dtype, dtype, true, false, 17, 9, 31, 1.0f, 0.0f, 3}, 22));
  }
}

TEST_F(CudaGemm, MatmulEmptyInnerDimensionScalesC) {
  Pair a = random_pair({5, 0}, DType::f32, 1);
  Pair b = random_pair({0, 6}, DType::f32, 2);
  Pair out = random_pair({5, 6}, DType::f32, 3);
  ops::cpu::matmul(out.cpu, a.cpu, b.cpu, {Transpose::no, Transpose::no, 1.0f, 0.5f});
  ops::cuda::matmul(out.gpu, a.gpu, b.gpu, {Transpose::no, Transpose::no, 1.0f, 0.5f});
  EXPECT_TRUE(equals_cpu(out));
  Pair zeroed = poisoned_pair({5, 6}, DType::f32);
  ops::cpu::matmul(zeroed.cpu, a.cpu, b.cpu, {});
  ops::cuda::matmul(zeroed.gpu, a.gpu, b.gpu, {});
  EXPECT_TRUE(equals_cpu(zeroed));
}

namespace {

::testing::AssertionResult run_linear_forward(DType dtype, const Shape& x_shape, int64_t out_features, bool with_bias,
                                              int64_t bias_misalign, uint64_t seed) {
  const int64_t in_features = x_shape.back();
  Shape y_shape = x_shape;
  y_shape.back() = out_features;
  Pair x = random_pair(x_shape, dtype, seed);
  Pair w = random_pair({out_features, in_features}, dtype, seed + 1);
  Pair bias = with_bias ? random_pair({out_features}, dtype, seed + 2, 1.0, bias_misalign) : Pair{};
  Pair y = poisoned_pair(y_shape, dtype);
  Tensor ref = zeros64(y_shape), abs_result = zeros64(y_shape);
  ops::cpu::linear_forward(ref, f64(x.cpu), f64(w.cpu), with_bias ? f64(bias.cpu) : Tensor());
  ops::cpu::linear_forward(abs_result, abs_f64(x.cpu), abs_f64(w.cpu), with_bias ? abs_f64(bias.cpu) : Tensor());
  ops::cuda::linear_forward(y.gpu, x.gpu, w.gpu, bias.gpu);
  return within_bound(y, ref, dot_bound(abs_result, ref, in_features, dtype))
         << " (linear_forward " << dtype_name(dtype) << " x " << shape_str(x_shape) << " out " << out_features
         << (with_bias ? " bias" : "") << ")";
}

}  // namespace

TEST_F(CudaGemm, LinearForwardWithAndWithoutBias) {
  const struct {
    Shape x;
    int64_t out;
  } cases[] = {{{1, 1, 8}, 8}, {{5, 3, 24}, 40}, {{7, 2, 33}, 17}, {{16, 8, 128}, 96}, {{9, 31}, 13}};
  uint64_t seed = 300;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& c : cases) {
      for (const bool bias : {false, true}) EXPECT_TRUE(run_linear_forward(dtype, c.x, c.out, bias, 0, seed += 3));
    }
  }
}

TEST_F(CudaGemm, LinearForwardBiasOffAlignment) {
  // A bias the BIAS epilogue may not accept takes the broadcast-then-accumulate path.
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_TRUE(run_linear_forward(dtype, {6, 4, 32}, 48, true, 1, 400));
  }
}

namespace {

::testing::AssertionResult run_linear_backward(DType dtype, const Shape& x_shape, int64_t out_features, bool with_dx,
                                               bool with_db, uint64_t seed,
                                               ops::GradWrite write = ops::GradWrite::accumulate) {
  const int64_t in_features = x_shape.back();
  Shape dy_shape = x_shape;
  dy_shape.back() = out_features;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) rows *= x_shape[i];
  Pair x = random_pair(x_shape, dtype, seed);
  Pair w = random_pair({out_features, in_features}, dtype, seed + 1);
  Pair dy = random_pair(dy_shape, dtype, seed + 2);
  Pair dx = with_dx ? poisoned_pair(x_shape, dtype) : Pair{};
  // Parameter gradients accumulate: they start from random main-grad contents; an overwritten
  // weight gradient starts as NaN, which must never be read.
  const bool overwrite = write == ops::GradWrite::overwrite;
  Pair dw = overwrite ? poisoned_pair({out_features, in_features}, DType::f32)
                      : random_pair({out_features, in_features}, DType::f32, seed + 3);
  Pair db = with_db ? random_pair({out_features}, DType::f32, seed + 4) : Pair{};

  Tensor dx_ref = with_dx ? zeros64(x_shape) : Tensor(), dw_ref = overwrite ? zeros64(w.cpu.shape()) : f64(dw.cpu),
         db_ref = with_db ? f64(db.cpu) : Tensor();
  ops::cpu::linear_backward(dx_ref, dw_ref, db_ref, f64(dy.cpu), f64(x.cpu), f64(w.cpu), ops::GradWrite::accumulate);
  Tensor dx_abs = with_dx ? zeros64(x_shape) : Tensor(), dw_abs = overwrite ? zeros64(w.cpu.shape()) : abs_f64(dw.cpu);
  Tensor db_abs = with_db ? abs_f64(db.cpu) : Tensor();
  ops::cpu::linear_backward(dx_abs, dw_abs, db_abs, abs_f64(dy.cpu), abs_f64(x.cpu), abs_f64(w.cpu),
                            ops::GradWrite::accumulate);

  ops::cuda::linear_backward(dx.gpu, dw.gpu, db.gpu, dy.gpu, x.gpu, w.gpu, write);
  const std::string what = std::string(" (linear_backward ") + dtype_name(dtype) + " x " + shape_str(x_shape) +
                           " out " + std::to_string(out_features) + ")";
  if (with_dx) {
    ::testing::AssertionResult r = within_bound(dx, dx_ref, dot_bound(dx_abs, dx_ref, out_features, dtype));
    if (!r) return r << " dx" << what;
  }
  ::testing::AssertionResult r = within_bound(dw, dw_ref, dot_bound(dw_abs, dw_ref, rows, DType::f32));
  if (!r) return r << " dweight" << what;
  if (with_db) {
    r = within_bound(db, db_ref, dot_bound(db_abs, db_ref, rows, DType::f32));
    if (!r) return r << " dbias" << what;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST_F(CudaGemm, LinearBackwardAccumulatesIntoFp32MainGrads) {
  const struct {
    Shape x;
    int64_t out;
  } cases[] = {{{1, 1, 8}, 8}, {{5, 3, 24}, 40}, {{7, 2, 33}, 17}, {{16, 8, 128}, 96}, {{130, 31}, 13}};
  uint64_t seed = 500;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& c : cases) EXPECT_TRUE(run_linear_backward(dtype, c.x, c.out, true, true, seed += 5));
  }
}

// The first weight gradient of a step into a main grad that was not zeroed (beta 0: the NaN it
// held is never read), with and without the bias gradient's epilogue.
TEST_F(CudaGemm, LinearBackwardOverwritesTheWeightGradientWhenAsked) {
  uint64_t seed = 700;
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const bool with_db : {true, false})
      EXPECT_TRUE(run_linear_backward(dtype, {16, 8, 128}, 96, true, with_db, seed += 5, ops::GradWrite::overwrite));
}

TEST_F(CudaGemm, LinearBackwardOptionalOutputsSkipped) {
  EXPECT_TRUE(run_linear_backward(DType::bf16, {6, 2, 16}, 24, false, false, 600));
  EXPECT_TRUE(run_linear_backward(DType::bf16, {6, 2, 16}, 24, true, false, 610));
  EXPECT_TRUE(run_linear_backward(DType::f32, {6, 2, 16}, 24, false, true, 620));
}

// dX alone (a TP layer's first half of backward) is the same GEMM as in the full call: equal bits.
TEST_F(CudaGemm, LinearBackwardDgradAloneEqualsTheFullCall) {
  Pair x = random_pair({6, 2, 16}, DType::bf16, 630), w = random_pair({24, 16}, DType::bf16, 631);
  Pair dy = random_pair({6, 2, 24}, DType::bf16, 632);
  Pair dx_full = poisoned_pair({6, 2, 16}, DType::bf16), dx_alone = poisoned_pair({6, 2, 16}, DType::bf16);
  Tensor dw = Tensor::zeros({24, 16}, DType::f32, gpu()), none;
  ops::cuda::linear_backward(dx_full.gpu, dw, none, dy.gpu, x.gpu, w.gpu, ops::GradWrite::accumulate);
  ops::cuda::linear_backward(dx_alone.gpu, none, none, dy.gpu, x.gpu, w.gpu, ops::GradWrite::accumulate);
  const Tensor a = dx_full.gpu.to(Device::cpu()), b = dx_alone.gpu.to(Device::cpu());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.item(i), b.item(i)) << i;
}

TEST_F(CudaGemm, RejectsF64AndMixedDtypes) {
  Tensor a = Tensor::empty({2, 3}, DType::f64, gpu()), b = Tensor::empty({3, 4}, DType::f64, gpu());
  Tensor c = Tensor::empty({2, 4}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::matmul(c, a, b, {}); }, "CPU-only"));
  Tensor a16 = Tensor::empty({2, 3}, DType::bf16, gpu()), b32 = Tensor::empty({3, 4}, DType::f32, gpu());
  Tensor c32 = Tensor::empty({2, 4}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::matmul(c32, a16, b32, {}); }, "matmul B"));
  Tensor host = Tensor::empty({2, 3}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::matmul(c32, host, b32, {}); }, "matmul A is on cpu"));
}

// ---- the GELU fused into the MLP's GEMMs -----------------------------------------------------
//
// References are the CPU ops in f64 on the same values. On top of the dot-product bound E above
// (for the GEMM part, computed without the 16-bit rounding):
//   y = gelu(p):         1.13 E + c u (|y| + |p|): GELU's slope is at most 1.13; c u covers the
//                        output rounding, the unfused path's rounding of p before the GELU and,
//                        for the epilogue, a faster tanh (c = 2 for 16-bit outputs; f32 runs the
//                        GELU kernel in float: c = 8 for its few roundings).
//   dpre = dact gelu'(p): 1.13 E + c u (|dpre| + |dact|), c = 3 for 16-bit, 16 for f32: the
//                        derivative's own evaluation error is amplified up to ~6.5x for |p| <= 3.3
//                        (through 0.5 p (1 - tanh^2) du/dp), plus the same roundings.
// u is the output dtype's unit roundoff. Row lengths that are multiples of 8 take cuBLASLt's GELU
// epilogues for 16-bit outputs, the others the unfused kernels; both must meet the bound.

namespace {

Tensor gelu_bound(const Tensor& e_gemm, const Tensor& out_ref, const Tensor& second, double u, double c) {
  Tensor bound = Tensor::empty(out_ref.shape(), DType::f64);
  for (int64_t i = 0; i < out_ref.numel(); ++i) {
    bound.set_item(i, 1.13 * e_gemm.item(i) + c * u * (std::fabs(out_ref.item(i)) + std::fabs(second.item(i))));
  }
  return bound;
}

struct GeluCase {
  DType dtype;
  int64_t rows, in, out;
};

::testing::AssertionResult run_linear_gelu_forward(const GeluCase& c, bool with_bias, uint64_t seed) {
  Pair x = random_pair({c.rows, c.in}, c.dtype, seed);
  Pair w = random_pair({c.out, c.in}, c.dtype, seed + 1, 0.25);
  Pair bias = with_bias ? random_pair({c.out}, c.dtype, seed + 2) : Pair{};
  Pair y = poisoned_pair({c.rows, c.out}, c.dtype), pre = poisoned_pair({c.rows, c.out}, c.dtype);
  Tensor y_ref = zeros64({c.rows, c.out}), pre_ref = zeros64({c.rows, c.out}), abs_pre = zeros64({c.rows, c.out});
  ops::cpu::linear_gelu_forward(y_ref, pre_ref, f64(x.cpu), f64(w.cpu), with_bias ? f64(bias.cpu) : Tensor());
  ops::cpu::linear_forward(abs_pre, abs_f64(x.cpu), abs_f64(w.cpu), with_bias ? abs_f64(bias.cpu) : Tensor());
  ops::cuda::linear_gelu_forward(y.gpu, pre.gpu, x.gpu, w.gpu, bias.gpu);
  const std::string what = std::string(" (linear_gelu_forward ") + dtype_name(c.dtype) + " " + std::to_string(c.rows) +
                           "x" + std::to_string(c.in) + " -> " + std::to_string(c.out) + (with_bias ? " bias)" : ")");
  ::testing::AssertionResult r = within_bound(pre, pre_ref, dot_bound(abs_pre, pre_ref, c.in, c.dtype));
  if (!r) return r << " pre" << what;
  const bool half = c.dtype != DType::f32;
  const Tensor e_gemm = dot_bound(abs_pre, pre_ref, c.in, DType::f32);
  r = within_bound(y, y_ref, gelu_bound(e_gemm, y_ref, pre_ref, unit_roundoff(c.dtype), half ? 2.0 : 8.0));
  if (!r) return r << " y" << what;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult run_gelu_linear_backward(const GeluCase& c, bool with_bias, uint64_t seed) {
  // fc2 of a GELU MLP: input x = gelu(pre) (in features), output gradient dy (out features).
  Pair pre = random_pair({c.rows, c.in}, c.dtype, seed);
  Tensor x_host = Tensor::empty({c.rows, c.in}, c.dtype);
  ops::cpu::gelu_forward(x_host, pre.cpu);
  Pair x = pair_of(x_host);
  Pair w = random_pair({c.out, c.in}, c.dtype, seed + 1, 0.25);
  Pair dy = random_pair({c.rows, c.out}, c.dtype, seed + 2);
  Pair dpre = poisoned_pair({c.rows, c.in}, c.dtype);
  Pair dw = random_pair({c.out, c.in}, DType::f32, seed + 3);
  Pair db = with_bias ? random_pair({c.out}, DType::f32, seed + 4) : Pair{};

  Tensor dpre_ref = zeros64({c.rows, c.in}), dw_ref = f64(dw.cpu), db_ref = with_bias ? f64(db.cpu) : Tensor();
  ops::cpu::gelu_linear_backward(dpre_ref, dw_ref, db_ref, f64(dy.cpu), f64(x.cpu), f64(w.cpu), f64(pre.cpu),
                                 ops::GradWrite::accumulate);
  // dact = dy W and its absolute-value bound S, from linear_backward on the CPU.
  Tensor dact = zeros64({c.rows, c.in}), dact_abs = zeros64({c.rows, c.in});
  Tensor dw_abs = abs_f64(dw.cpu), db_abs = with_bias ? abs_f64(db.cpu) : Tensor();
  Tensor scratch_w = zeros64({c.out, c.in}), no_db;
  ops::cpu::linear_backward(dact, scratch_w, no_db, f64(dy.cpu), f64(x.cpu), f64(w.cpu), ops::GradWrite::accumulate);
  ops::cpu::linear_backward(dact_abs, dw_abs, db_abs, abs_f64(dy.cpu), abs_f64(x.cpu), abs_f64(w.cpu),
                            ops::GradWrite::accumulate);

  ops::cuda::gelu_linear_backward(dpre.gpu, dw.gpu, db.gpu, dy.gpu, x.gpu, w.gpu, pre.gpu, ops::GradWrite::accumulate);
  const std::string what = std::string(" (gelu_linear_backward ") + dtype_name(c.dtype) + " " + std::to_string(c.rows) +
                           "x" + std::to_string(c.in) + " <- " + std::to_string(c.out) + (with_bias ? " bias)" : ")");
  const bool half = c.dtype != DType::f32;
  const Tensor e_gemm = dot_bound(dact_abs, dact, c.out, DType::f32);
  ::testing::AssertionResult r =
      within_bound(dpre, dpre_ref, gelu_bound(e_gemm, dpre_ref, dact, unit_roundoff(c.dtype), half ? 3.0 : 16.0));
  if (!r) return r << " dpre" << what;
  r = within_bound(dw, dw_ref, dot_bound(dw_abs, dw_ref, c.rows, DType::f32));
  if (!r) return r << " dweight" << what;
  if (with_bias) {
    r = within_bound(db, db_ref, dot_bound(db_abs, db_ref, c.rows, DType::f32));
    if (!r) return r << " dbias" << what;
  }
  return ::testing::AssertionSuccess();
}

// Row lengths (out for the forward, in for the backward) of 64 and 256 take the epilogues for
// 16-bit dtypes; 20 and 13 the unfused kernels.
const GeluCase kGeluShapes[] = {{DType::f32, 37, 24, 64},  {DType::f32, 16, 13, 20},     {DType::bf16, 37, 24, 64},
                                {DType::bf16, 16, 13, 20}, {DType::bf16, 512, 128, 256}, {DType::f16, 37, 24, 64},
                                {DType::f16, 16, 13, 20},  {DType::f16, 512, 128, 256}};

}  // namespace

TEST_F(CudaGemm, LinearGeluForwardMatchesCpu) {
  uint64_t seed = 800;
  for (const GeluCase& c : kGeluShapes) {
    for (const bool bias : {true, false}) EXPECT_TRUE(run_linear_gelu_forward(c, bias, seed += 3));
  }
}

TEST_F(CudaGemm, GeluLinearBackwardMatchesCpu) {
  uint64_t seed = 900;
  for (const GeluCase& c : kGeluShapes) {
    // The backward's GELU row is `in` long: swap so the same shapes cover both paths.
    const GeluCase back{c.dtype, c.rows, c.out, c.in};
    for (const bool bias : {true, false}) EXPECT_TRUE(run_gelu_linear_backward(back, bias, seed += 5));
  }
}

// The bias gradient out of the weight-gradient GEMM (BGRADB) on training-like sizes, and twice
// the same: the main grad accumulates and the result does not depend on the run.
TEST_F(CudaGemm, LinearBackwardBiasGradientLargeRowsDeterministic) {
  EXPECT_TRUE(run_linear_backward(DType::bf16, {256, 16, 64}, 192, true, true, 1000));
  const Pair x = random_pair({4096, 64}, DType::bf16, 1010), w = random_pair({192, 64}, DType::bf16, 1011);
  const Pair dy = random_pair({4096, 192}, DType::bf16, 1012);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dw = Tensor::zeros({192, 64}, DType::f32, gpu()), db = Tensor::zeros({192}, DType::f32, gpu()), no_dx;
    ops::cuda::linear_backward(no_dx, dw, db, dy.gpu, x.gpu, w.gpu, ops::GradWrite::accumulate);
    if (run == 0) {
      first = db.to_vector();
    } else {
      EXPECT_EQ(db.to_vector(), first);
    }
  }
}
