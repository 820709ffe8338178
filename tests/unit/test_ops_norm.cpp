#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/fp8.h"
#include "megatron/ops/norm.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::NormKind;
using megatron::ops::NormParams;

namespace {

constexpr int64_t kS = 5, kB = 2, kC = 8, kN = kS * kB;

DType stat_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

struct NormRun {
  Tensor y, mean, rstd, dx, dw, db;
};

// Forward then backward in x's dtype, with NaN-poisoned outputs and zeroed parameter gradients.
NormRun run_norm(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, const NormParams& p) {
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const bool ln = p.kind == NormKind::layernorm;
  NormRun r{poisoned(x.shape(), dt), ln ? poisoned({kN}, st) : Tensor(),
            poisoned({kN}, st),      poisoned(x.shape(), dt),
            Tensor::zeros({kC}, st), b.defined() ? Tensor::zeros({kC}, st) : Tensor()};
  ops::norm_forward(r.y, r.mean, r.rstd, x, w, b, p);
  ops::norm_backward(r.dx, r.dw, r.db, dy, x, w, r.mean, r.rstd, p);
  return r;
}

const NormParams kLayerNorm{NormKind::layernorm, 1e-5f};
const NormParams kRmsNorm{NormKind::rmsnorm, 1e-5f};

}  // namespace

TEST(Norm, KnownValues) {
  // LayerNorm of [1, 2, 3, 4]: mean 2.5, biased variance 1.25. RMSNorm of [3, 4]: mean square 12.5.
  const Tensor x = Tensor::from_vector({1, 2, 3, 4}, {1, 4}, DType::f64);
  Tensor y = Tensor::empty({1, 4}, DType::f64), mean = Tensor::empty({1}, DType::f64);
  Tensor rstd = Tensor::empty({1}, DType::f64);
  ops::norm_forward(y, mean, rstd, x, filled({4}, DType::f64, 2.0), filled({4}, DType::f64, 0.5), kLayerNorm);
  const double s = 1.0 / std::sqrt(1.25 + double(1e-5f));
  EXPECT_DOUBLE_EQ(mean.item(0), 2.5);
  EXPECT_DOUBLE_EQ(rstd.item(0), s);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(y.item(i), (i + 1 - 2.5) * s * 2.0 + 0.5);

  const Tensor x2 = Tensor::from_vector({3, 4}, {1, 2}, DType::f64);
  Tensor y2 = Tensor::empty({1, 2}, DType::f64), no_mean;
  ops::norm_forward(y2, no_mean, rstd, x2, filled({2}, DType::f64, 1.0), Tensor(), kRmsNorm);
  const double s2 = 1.0 / std::sqrt(12.5 + double(1e-5f));
  EXPECT_DOUBLE_EQ(y2.item(0), 3.0 * s2);
  EXPECT_DOUBLE_EQ(y2.item(1), 4.0 * s2);
}

TEST(Norm, GradientsMatchFiniteDifferences) {
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    Tensor x = randn({kS, kB, kC}, DType::f64, 1, 2.0);
    Tensor w = randn({kC}, DType::f64, 2);
    Tensor b = ln ? randn({kC}, DType::f64, 3) : Tensor();
    const Tensor r = randn({kS, kB, kC}, DType::f64, 4);
    const auto loss = [&] {
      Tensor y = Tensor::empty(x.shape(), DType::f64), rstd = Tensor::empty({kN}, DType::f64);
      Tensor mean = ln ? Tensor::empty({kN}, DType::f64) : Tensor();
      ops::norm_forward(y, mean, rstd, x, w, b, p);
      return sum_product(y, r);
    };
    const NormRun run = run_norm(x, w, b, r, p);
    const char* kind = ln ? "layernorm" : "rmsnorm";
    EXPECT_TRUE(grad_close(run.dx, numeric_grad(x, loss))) << kind << " dx";
    EXPECT_TRUE(grad_close(run.dw, numeric_grad(w, loss))) << kind << " dw";
    if (ln) {
      EXPECT_TRUE(grad_close(run.db, numeric_grad(b, loss))) << kind << " db";
    }
  }
}

TEST(Norm, LowerPrecisionMatchesF64) {
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    const Tensor x = randn({kS, kB, kC}, DType::f64, 10, 2.0), w = randn({kC}, DType::f64, 11);
    const Tensor b = ln ? randn({kC}, DType::f64, 12) : Tensor(), dy = randn({kS, kB, kC}, DType::f64, 13);
    const NormRun ref = run_norm(x, w, b, dy, p);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const NormRun run = run_norm(x.to(dt), w.to(dt), ln ? b.to(dt) : Tensor(), dy.to(dt), p);
      const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt);
      // Statistics are f32 for both dtypes: sums of C = 8 terms, a division and a square root,
      // about C + 4 roundings in f32.
      if (ln) {
        EXPECT_TRUE(matches_reference(run.mean, ref.mean, kUnitRoundoffF32, kC + 4)) << what << " mean";
      }
      EXPECT_TRUE(matches_reference(run.rstd, ref.rstd, kUnitRoundoffF32, kC + 4)) << what << " rstd";
      // y and dx: the f32 statistics' error times a few more operations (2C + 8 roundings), then
      // for bf16/f16 one rounding of the result (factor 2 leaves room for the f32 part, 2^-16 /
      // 2^-13 smaller).
      const double u = unit_roundoff(dt), factor = dt == DType::f32 ? 2 * kC + 8 : 2.0;
      EXPECT_TRUE(matches_reference(run.y, ref.y, u, factor)) << what << " y";
      EXPECT_TRUE(matches_reference(run.dx, ref.dx, u, factor)) << what << " dx";
      // Parameter gradients stay f32: N = 10 row terms each on top of the per-row error above.
      EXPECT_TRUE(matches_reference(run.dw, ref.dw, kUnitRoundoffF32, 2 * kC + 8 + kN)) << what << " dw";
      if (ln) {
        EXPECT_TRUE(matches_reference(run.db, ref.db, kUnitRoundoffF32, kN)) << what << " db";
      }
    }
  }
}

TEST(Norm, OutputsFullyWrittenParameterGradientsAccumulate) {
  const Tensor x = randn({kN, kC}, DType::f32, 20), w = randn({kC}, DType::f32, 21), b = randn({kC}, DType::f32, 22);
  const Tensor dy = randn({kN, kC}, DType::f32, 23);
  const NormRun fresh = run_norm(x, w, b, dy, kLayerNorm);  // outputs started as NaN
  for (const Tensor* t : {&fresh.y, &fresh.mean, &fresh.rstd, &fresh.dx}) ASSERT_TRUE(all_finite(*t));

  const Tensor dw0 = randn({kC}, DType::f32, 24), db0 = randn({kC}, DType::f32, 25);
  Tensor dx = filled({kN, kC}, DType::f32, -7.0), dw = dw0.clone(), db = db0.clone();
  ops::norm_backward(dx, dw, db, dy, x, w, fresh.mean, fresh.rstd, kLayerNorm);
  for (int64_t c = 0; c < kC; ++c) {
    // dw = dw0 + (the gradient from zero): the same float sum added once.
    ASSERT_EQ(dw.item(c), double(float(dw0.item(c)) + float(fresh.dw.item(c)))) << c;
    ASSERT_EQ(db.item(c), double(float(db0.item(c)) + float(fresh.db.item(c)))) << c;
  }
  EXPECT_TRUE(all_close(dx, fresh.dx, 0.0, 0.0));  // overwritten, not accumulated
}

TEST(Norm, ParallelRunMatchesSerialRunBitwise) {
  // N * C = 1024 * 64 is above the serial threshold; the channel loop of dw, db runs in parallel too.
  const int64_t N = 1024, C = 64;
  const Tensor x = randn({N, C}, DType::bf16, 30), w = randn({C}, DType::bf16, 31), b = randn({C}, DType::bf16, 32);
  const Tensor dy = randn({N, C}, DType::bf16, 33);
  std::vector<Tensor> runs[2];
  for (int t : {0, 1}) {
    with_threads(t == 0 ? 1 : 2, [&] {
      Tensor y = poisoned({N, C}, DType::bf16), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
      Tensor dx = poisoned({N, C}, DType::bf16), dw = Tensor::zeros({C}, DType::f32),
             db = Tensor::zeros({C}, DType::f32);
      ops::norm_forward(y, mean, rstd, x, w, b, kLayerNorm);
      ops::norm_backward(dx, dw, db, dy, x, w, mean, rstd, kLayerNorm);
      runs[t] = {y, mean, rstd, dx, dw, db};
    });
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(all_finite(runs[1][i])) << i;
    EXPECT_TRUE(all_close(runs[1][i], runs[0][i], 0.0, 0.0)) << i;
  }
}

TEST(Norm, RejectsBadArguments) {
  const Tensor x = randn({kN, kC}, DType::f32, 1), w = randn({kC}, DType::f32, 2);
  Tensor y = Tensor::empty({kN, kC}, DType::f32), mean = Tensor::empty({kN}, DType::f32);
  Tensor rstd = Tensor::empty({kN}, DType::f32), no_mean;
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::norm_forward(y, mean, rstd, x, randn({kC + 1}, DType::f32, 3), Tensor(), kLayerNorm); },
      "norm weight"));
  Tensor rstd64 = Tensor::empty({kN}, DType::f64);
  EXPECT_TRUE(
      throws_error_naming([&] { ops::norm_forward(y, mean, rstd64, x, w, Tensor(), kLayerNorm); }, "norm rstd"));
  EXPECT_TRUE(throws_error_naming(
      [&] { ops::norm_forward(y, no_mean, rstd, x, w, randn({kC}, DType::f32, 4), kRmsNorm); }, "RMSNorm has no bias"));
}

// ---- fused residual add + norm ---------------------------------------------------------------

namespace {

struct AddNormRun {
  Tensor h, y, mean, rstd, dx, dw, db;
};

// add_norm_forward then add_norm_backward in x's dtype, outputs NaN-poisoned, parameter gradients
// from zero.
AddNormRun run_add_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b, const Tensor& dy,
                        const Tensor& dh, const NormParams& p) {
  const DType dt = x.dtype(), st = stat_dtype(dt);
  const bool ln = p.kind == NormKind::layernorm;
  AddNormRun run{poisoned(x.shape(), dt),
                 poisoned(x.shape(), dt),
                 ln ? poisoned({kN}, st) : Tensor(),
                 poisoned({kN}, st),
                 poisoned(x.shape(), dt),
                 Tensor::zeros({kC}, st),
                 b.defined() ? Tensor::zeros({kC}, st) : Tensor()};
  ops::add_norm_forward(run.h, run.y, run.mean, run.rstd, x, r, w, b, p);
  ops::add_norm_backward(run.dx, run.dw, run.db, dy, dh, run.h, w, run.mean, run.rstd, p);
  return run;
}

}  // namespace

TEST(AddNorm, ForwardIsTheAddThenTheNormBitwise) {
  // h is rounded to the storage dtype before the norm reads it, exactly as add then norm_forward.
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = randn({kS, kB, kC}, dt, 40, 2.0), r = randn({kS, kB, kC}, dt, 41, 2.0);
      const Tensor w = randn({kC}, dt, 42), b = ln ? randn({kC}, dt, 43) : Tensor();
      const AddNormRun fused = run_add_norm(x, r, w, b, randn(x.shape(), dt, 44), randn(x.shape(), dt, 45), p);
      Tensor h = poisoned(x.shape(), dt), y = poisoned(x.shape(), dt);
      Tensor mean = ln ? poisoned({kN}, stat_dtype(dt)) : Tensor(), rstd = poisoned({kN}, stat_dtype(dt));
      ops::add(h, x, r);
      ops::norm_forward(y, mean, rstd, h, w, b, p);
      const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt);
      EXPECT_TRUE(all_close(fused.h, h, 0.0, 0.0)) << what << " h";
      EXPECT_TRUE(all_close(fused.y, y, 0.0, 0.0)) << what << " y";
      EXPECT_TRUE(all_close(fused.rstd, rstd, 0.0, 0.0)) << what << " rstd";
      if (ln) {
        EXPECT_TRUE(all_close(fused.mean, mean, 0.0, 0.0)) << what << " mean";
      }
    }
  }
}

// Without y the norms compute the same statistics (and h), and norm_forward_fp8 casts from them
// the bytes fp8_quantize_transpose casts from the norm's y (an independent path: the cast of a
// stored y). Amaxes accumulate into what was there.
TEST(NormFp8, StatisticsAloneThenTheCastAreTheNormThenTheCast) {
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    for (DType dt : {DType::f32, DType::bf16}) {
      const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt);
      const Tensor x = randn({kN, kC}, dt, 50, 2.0), r = randn({kN, kC}, dt, 51, 2.0);
      const Tensor w = randn({kC}, dt, 52), b = ln ? randn({kC}, dt, 53) : Tensor();
      Tensor h = poisoned(x.shape(), dt), y = poisoned(x.shape(), dt), none;
      Tensor mean = ln ? poisoned({kN}, stat_dtype(dt)) : Tensor(), rstd = poisoned({kN}, stat_dtype(dt));
      ops::add_norm_forward(h, y, mean, rstd, x, r, w, b, p);
      Tensor h2 = poisoned(x.shape(), dt), mean2 = ln ? poisoned({kN}, stat_dtype(dt)) : Tensor();
      Tensor rstd2 = poisoned({kN}, stat_dtype(dt));
      ops::add_norm_forward(h2, none, mean2, rstd2, x, r, w, b, p);
      EXPECT_TRUE(all_close(h2, h, 0.0, 0.0)) << what << " h";
      EXPECT_TRUE(all_close(rstd2, rstd, 0.0, 0.0)) << what << " rstd";
      if (ln) {
        EXPECT_TRUE(all_close(mean2, mean, 0.0, 0.0)) << what << " mean";
      }
      for (DType q_dtype : {DType::e4m3, DType::e5m2}) {
        const Tensor scale = Tensor::from_vector({37.0f}, {1});
        Tensor q = Tensor::empty({kN, kC}, q_dtype), q_t = Tensor::empty({kC, kN}, q_dtype);
        Tensor uq = Tensor::empty({kN, kC}, q_dtype), uq_t = Tensor::empty({kC, kN}, q_dtype);
        Tensor amax = Tensor::from_vector({0.5f}, {1}), unfused_amax = Tensor::from_vector({0.5f}, {1});
        ops::norm_forward_fp8(q, q_t, amax, h2, w, b, mean2, rstd2, p, scale);
        ops::fp8_quantize_transpose(uq, uq_t, unfused_amax, y, scale);
        EXPECT_EQ(std::memcmp(q.raw(), uq.raw(), q.nbytes()), 0) << what;
        EXPECT_EQ(std::memcmp(q_t.raw(), uq_t.raw(), q_t.nbytes()), 0) << what;
        EXPECT_EQ(amax.item(), unfused_amax.item()) << what;
        EXPECT_GT(amax.item(), 0.5) << what;              // the norm's output, not the initial 0.5
        Tensor wrong = Tensor::empty({kN, kC}, q_dtype);  // q_t not transposed
        EXPECT_THROW(ops::norm_forward_fp8(none, wrong, amax, h2, w, b, mean2, rstd2, p, scale), Error) << what;
      }
    }
  }
}

TEST(AddNorm, GradientsMatchFiniteDifferences) {
  // L = sum(y R) + sum(h Q): y reaches the loss through the norm, h along the residual stream. The
  // gradient of h = x + residual is the same for both inputs: add_norm_backward's dx.
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    Tensor x = randn({kS, kB, kC}, DType::f64, 50, 2.0), res = randn({kS, kB, kC}, DType::f64, 51);
    Tensor w = randn({kC}, DType::f64, 52), b = ln ? randn({kC}, DType::f64, 53) : Tensor();
    const Tensor r = randn({kS, kB, kC}, DType::f64, 54), q = randn({kS, kB, kC}, DType::f64, 55);
    const auto loss = [&] {
      Tensor h = Tensor::empty(x.shape(), DType::f64), y = Tensor::empty(x.shape(), DType::f64);
      Tensor mean = ln ? Tensor::empty({kN}, DType::f64) : Tensor(), rstd = Tensor::empty({kN}, DType::f64);
      ops::add_norm_forward(h, y, mean, rstd, x, res, w, b, p);
      return sum_product(y, r) + sum_product(h, q);
    };
    const AddNormRun run = run_add_norm(x, res, w, b, r, q, p);
    const char* kind = ln ? "layernorm" : "rmsnorm";
    EXPECT_TRUE(grad_close(run.dx, numeric_grad(x, loss))) << kind << " dx";
    EXPECT_TRUE(grad_close(run.dx, numeric_grad(res, loss))) << kind << " dresidual";
    EXPECT_TRUE(grad_close(run.dw, numeric_grad(w, loss))) << kind << " dw";
    if (ln) {
      EXPECT_TRUE(grad_close(run.db, numeric_grad(b, loss))) << kind << " db";
    }
  }
}

TEST(AddNorm, LowerPrecisionMatchesF64AndTheUnfusedParameterGradients) {
  for (const NormParams& p : {kLayerNorm, kRmsNorm}) {
    const bool ln = p.kind == NormKind::layernorm;
    const Tensor x = randn({kS, kB, kC}, DType::f64, 60, 2.0), r = randn({kS, kB, kC}, DType::f64, 61);
    const Tensor w = randn({kC}, DType::f64, 62), b = ln ? randn({kC}, DType::f64, 63) : Tensor();
    const Tensor dy = randn({kS, kB, kC}, DType::f64, 64), dh = randn({kS, kB, kC}, DType::f64, 65);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const AddNormRun run =
          run_add_norm(x.to(dt), r.to(dt), w.to(dt), ln ? b.to(dt) : Tensor(), dy.to(dt), dh.to(dt), p);
      // The f64 reference normalises the same rounded h, so only the norm's own arithmetic differs.
      const NormRun ref = run_norm(run.h.to(DType::f64), w, b, dy, p);
      const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt);
      // h = x + r: one rounding.
      Tensor h64 = Tensor::empty(x.shape(), DType::f64);
      ops::add(h64, x, r);
      EXPECT_TRUE(matches_reference(run.h, h64, unit_roundoff(dt), 1.0)) << what << " h";
      // y as for the plain norm (Norm.LowerPrecisionMatchesF64: 2C + 8 roundings in f32, one
      // 16-bit rounding); dx adds dh in float before its single rounding, so the same bound holds
      // against ref.dx + dh.
      const double u = unit_roundoff(dt), factor = dt == DType::f32 ? 2 * kC + 8 : 2.0;
      EXPECT_TRUE(matches_reference(run.y, ref.y, u, factor)) << what << " y";
      Tensor dx64 = Tensor::empty(x.shape(), DType::f64);
      ops::add(dx64, ref.dx, dh);
      EXPECT_TRUE(matches_reference(run.dx, dx64, u, factor)) << what << " dx";
      // The parameter gradients come from the norm's own code path: bitwise the unfused result.
      const NormRun unfused = run_norm(run.h, w.to(dt), ln ? b.to(dt) : Tensor(), dy.to(dt), p);
      EXPECT_TRUE(all_close(run.dw, unfused.dw, 0.0, 0.0)) << what << " dw";
      if (ln) {
        EXPECT_TRUE(all_close(run.db, unfused.db, 0.0, 0.0)) << what << " db";
      }
    }
  }
}

TEST(AddNorm, RejectsBadArguments) {
  const Tensor x = randn({kN, kC}, DType::f32, 1), w = randn({kC}, DType::f32, 2);
  Tensor h = Tensor::empty({kN, kC}, DType::f32), y = Tensor::empty({kN, kC}, DType::f32), no_mean;
  Tensor rstd = Tensor::empty({kN}, DType::f32);
  EXPECT_TRUE(throws_error_naming(
      [&] {
        ops::add_norm_forward(h, y, no_mean, rstd, x, randn({kN, kC + 1}, DType::f32, 3), w, Tensor(), kRmsNorm);
      },
      "norm residual"));
  Tensor h16 = Tensor::empty({kN, kC}, DType::bf16);
  EXPECT_TRUE(throws_error_naming([&] { ops::add_norm_forward(h16, y, no_mean, rstd, x, x, w, Tensor(), kRmsNorm); },
                                  "norm h"));
  Tensor dx = Tensor::empty({kN, kC}, DType::f32), dw = Tensor::zeros({kC}, DType::f32), no_db;
  EXPECT_TRUE(throws_error_naming(
      [&] {
        ops::add_norm_backward(dx, dw, no_db, x, randn({kN + 1, kC}, DType::f32, 4), x, w, no_mean, rstd, kRmsNorm);
      },
      "norm dh"));
}
