// CUDA LayerNorm/RMSNorm against the CPU op run in f64 on the same (bf16-exact) inputs: vector and
// scalar paths, every output poisoned, parameter gradients accumulated and deterministic.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/fp8.h"
#include "megatron/ops/norm.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::NormKind;
using megatron::ops::NormParams;

namespace {

class CudaNorm : public CudaTest {};

struct Shape2 {
  int64_t N, C, misalign;  // misalign shifts every GPU tensor off 16 bytes: the scalar path
};

// C = 96 and 1024 take 16-byte packs; C = 99 and the shifted case take scalars.
const Shape2 kShapes[] = {{37, 96, 0}, {64, 1024, 0}, {5, 99, 0}, {16, 256, 1}};

Tensor optional_f64(const Pair& p, bool use) { return use ? f64(p.cpu) : Tensor(); }

}  // namespace

TEST_F(CudaNorm, ForwardAndBackwardMatchCpuF64) {
  uint64_t seed = 100;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    const NormParams p{kind, 1e-5f};
    const bool ln = kind == NormKind::layernorm;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      for (const Shape2& s : kShapes) {
        const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt) +
                                 " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                                 " misalign=" + std::to_string(s.misalign);
        const Pair x = random_pair({s.N, s.C}, dt, ++seed, 2.0, s.misalign);
        const Pair w = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
        const Pair b = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
        const Pair dy = random_pair({s.N, s.C}, dt, ++seed, 1.0, s.misalign);
        Pair y = poisoned_pair({s.N, s.C}, dt, s.misalign), dx = poisoned_pair({s.N, s.C}, dt, s.misalign);
        Pair mean = poisoned_pair({s.N}, DType::f32), rstd = poisoned_pair({s.N}, DType::f32);
        Pair dw = random_pair({s.C}, DType::f32, ++seed), db = random_pair({s.C}, DType::f32, ++seed);

        Tensor gpu_mean = ln ? mean.gpu : Tensor(), gpu_db = ln ? db.gpu : Tensor();
        ops::cuda::norm_forward(y.gpu, gpu_mean, rstd.gpu, x.gpu, w.gpu, ln ? b.gpu : Tensor(), p);
        ops::cuda::norm_backward(dx.gpu, dw.gpu, gpu_db, dy.gpu, x.gpu, w.gpu, gpu_mean, rstd.gpu, p);

        Tensor ry = poisoned({s.N, s.C}, DType::f64), rdx = poisoned({s.N, s.C}, DType::f64);
        Tensor rmean = ln ? poisoned({s.N}, DType::f64) : Tensor(), rrstd = poisoned({s.N}, DType::f64);
        Tensor rdw = f64(dw.cpu), rdb = ln ? f64(db.cpu) : Tensor();
        const Tensor xr = f64(x.cpu), wr = f64(w.cpu);
        ops::cpu::norm_forward(ry, rmean, rrstd, xr, wr, optional_f64(b, ln), p);
        ops::cpu::norm_backward(rdx, rdw, rdb, f64(dy.cpu), xr, wr, rmean, rrstd, p);

        // Statistics are f32 for both dtypes: sums of C terms, a division and a square root, about
        // C + 4 roundings in f32 (the CPU f32 op's bound, tests/unit/test_ops_norm.cpp).
        if (ln) {
          EXPECT_TRUE(matches(mean, rmean, kUnitRoundoffF32, double(s.C) + 4)) << what << " mean";
        }
        EXPECT_TRUE(matches(rstd, rrstd, kUnitRoundoffF32, double(s.C) + 4)) << what << " rstd";
        // y and dx: the f32 statistics' error times a few more operations (2C + 8 roundings); for
        // bf16/f16 one rounding of the result, with factor 2 leaving room for the f32 part.
        const double u = unit_roundoff(dt), factor = dt == DType::f32 ? 2.0 * double(s.C) + 8 : 2.0;
        EXPECT_TRUE(matches(y, ry, u, factor)) << what << " y";
        EXPECT_TRUE(matches(dx, rdx, u, factor)) << what << " dx";
        // Parameter gradients stay f32 and accumulate onto random starting values: N row terms on
        // top of the per-row error above.
        EXPECT_TRUE(matches(dw, rdw, kUnitRoundoffF32, 2.0 * double(s.C) + 8 + double(s.N))) << what << " dw";
        if (ln) {
          EXPECT_TRUE(matches(db, rdb, kUnitRoundoffF32, double(s.N))) << what << " db";
        }
      }
    }
  }
}

// No float atomics: the same inputs give the same parameter gradients bit for bit, with N large
// enough for many row chunks.
TEST_F(CudaNorm, ParameterGradientsAreDeterministic) {
  const NormParams p{NormKind::layernorm, 1e-5f};
  const int64_t N = 4096, C = 384;
  const Pair x = random_pair({N, C}, DType::bf16, 1), w = random_pair({C}, DType::bf16, 2);
  const Pair b = random_pair({C}, DType::bf16, 3), dy = random_pair({N, C}, DType::bf16, 4);
  Tensor y = Tensor::empty({N, C}, DType::bf16, gpu()), dx = Tensor::empty({N, C}, DType::bf16, gpu());
  Tensor mean = Tensor::empty({N}, DType::f32, gpu()), rstd = Tensor::empty({N}, DType::f32, gpu());
  ops::cuda::norm_forward(y, mean, rstd, x.gpu, w.gpu, b.gpu, p);
  std::vector<float> first_w, first_b;
  for (int run = 0; run < 3; ++run) {
    Tensor dw = Tensor::zeros({C}, DType::f32, gpu()), db = Tensor::zeros({C}, DType::f32, gpu());
    ops::cuda::norm_backward(dx, dw, db, dy.gpu, x.gpu, w.gpu, mean, rstd, p);
    if (run == 0) {
      first_w = dw.to_vector();
      first_b = db.to_vector();
    } else {
      EXPECT_EQ(dw.to_vector(), first_w) << "run " << run;
      EXPECT_EQ(db.to_vector(), first_b) << "run " << run;
    }
  }
}

// The backward at training sizes, each case against the CPU op in f64 (the bounds of
// ForwardAndBackwardMatchCpuF64) and run twice more for bitwise-equal parameter gradients:
//   llama-3b's rows (4096 x 3072 bf16 RMSNorm, the fused add): block teams, 16-byte packs, whole
//   row chunks;
//   LayerNorm with C = 3000 (not a multiple of the pack: the scalar path) and N = 4100 (a last,
//   partial chunk of rows);
//   gpt2-124m's rows (32768 x 768 bf16 LayerNorm, the fused add): warp teams, many rows a warp;
//   C = 1001 RMSNorm, N = 777: warp teams on the scalar path, a last, partial chunk;
//   C = 70000 RMSNorm bf16 and C = 30000 LayerNorm f32: more dweight (and dbias) sums than a
//   block's shared memory holds (C floats each), summed in the partials buffer instead.
TEST_F(CudaNorm, BackwardAtTrainingSizesMatchesCpuAndIsDeterministic) {
  struct Case {
    int64_t N, C;
    NormKind kind;
    DType dt;
    bool add;  // add_norm_backward (dh given) rather than norm_backward
  };
  const Case cases[] = {
      {4096, 3072, NormKind::rmsnorm, DType::bf16, true},   {4100, 3000, NormKind::layernorm, DType::bf16, false},
      {32768, 768, NormKind::layernorm, DType::bf16, true}, {777, 1001, NormKind::rmsnorm, DType::bf16, false},
      {3, 70000, NormKind::rmsnorm, DType::bf16, true},     {5, 30000, NormKind::layernorm, DType::f32, false},
  };
  uint64_t seed = 900;
  for (const Case& s : cases) {
    const bool ln = s.kind == NormKind::layernorm;
    const NormParams p{s.kind, 1e-5f};
    const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(s.dt) +
                             " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + (s.add ? " add" : "");
    const Pair x = random_pair({s.N, s.C}, s.dt, ++seed, 2.0), w = random_pair({s.C}, s.dt, ++seed);
    const Pair b = random_pair({s.C}, s.dt, ++seed), dy = random_pair({s.N, s.C}, s.dt, ++seed);
    const Pair dh = random_pair({s.N, s.C}, s.dt, ++seed);
    const uint64_t dw_seed = ++seed, db_seed = ++seed;
    Pair y = poisoned_pair({s.N, s.C}, s.dt), dx = poisoned_pair({s.N, s.C}, s.dt);
    Pair mean = poisoned_pair({s.N}, DType::f32), rstd = poisoned_pair({s.N}, DType::f32);
    Tensor gpu_mean = ln ? mean.gpu : Tensor();
    ops::cuda::norm_forward(y.gpu, gpu_mean, rstd.gpu, x.gpu, w.gpu, ln ? b.gpu : Tensor(), p);
    // Parameter gradients accumulate onto the same random start in every run.
    const auto backward = [&](Pair& dw, Pair& db) {
      Tensor gpu_db = ln ? db.gpu : Tensor();
      if (s.add) {
        ops::cuda::add_norm_backward(dx.gpu, dw.gpu, gpu_db, dy.gpu, dh.gpu, x.gpu, w.gpu, gpu_mean, rstd.gpu, p);
      } else {
        ops::cuda::norm_backward(dx.gpu, dw.gpu, gpu_db, dy.gpu, x.gpu, w.gpu, gpu_mean, rstd.gpu, p);
      }
    };
    Pair dw = random_pair({s.C}, DType::f32, dw_seed), db = random_pair({s.C}, DType::f32, db_seed);
    backward(dw, db);

    Tensor ry = poisoned({s.N, s.C}, DType::f64), rdx = poisoned({s.N, s.C}, DType::f64);
    Tensor rmean = ln ? poisoned({s.N}, DType::f64) : Tensor(), rrstd = poisoned({s.N}, DType::f64);
    Tensor rdw = f64(dw.cpu), rdb = ln ? f64(db.cpu) : Tensor();
    const Tensor xr = f64(x.cpu), wr = f64(w.cpu);
    ops::cpu::norm_forward(ry, rmean, rrstd, xr, wr, optional_f64(b, ln), p);
    if (s.add) {
      ops::cpu::add_norm_backward(rdx, rdw, rdb, f64(dy.cpu), f64(dh.cpu), xr, wr, rmean, rrstd, p);
    } else {
      ops::cpu::norm_backward(rdx, rdw, rdb, f64(dy.cpu), xr, wr, rmean, rrstd, p);
    }
    // As in ForwardAndBackwardMatchCpuF64: dx one rounding of the output dtype on top of the f32
    // statistics (2C + 8 roundings for f32 outputs), dweight N row terms more in f32.
    const double u = unit_roundoff(s.dt), factor = s.dt == DType::f32 ? 2.0 * double(s.C) + 8 : 2.0;
    EXPECT_TRUE(matches(dx, rdx, u, factor)) << what << " dx";
    EXPECT_TRUE(matches(dw, rdw, kUnitRoundoffF32, 2.0 * double(s.C) + 8 + double(s.N))) << what << " dw";
    if (ln) {
      EXPECT_TRUE(matches(db, rdb, kUnitRoundoffF32, double(s.N))) << what << " db";
    }
    for (int run = 1; run < 3; ++run) {
      Pair again_w = random_pair({s.C}, DType::f32, dw_seed), again_b = random_pair({s.C}, DType::f32, db_seed);
      backward(again_w, again_b);
      EXPECT_EQ(again_w.gpu.to_vector(), dw.gpu.to_vector()) << what << " dw, run " << run;
      if (ln) {
        EXPECT_EQ(again_b.gpu.to_vector(), db.gpu.to_vector()) << what << " db, run " << run;
      }
    }
  }
}

TEST_F(CudaNorm, RejectsF64AndCpuTensors) {
  const NormParams p{NormKind::rmsnorm, 1e-5f};
  Tensor x = Tensor::zeros({4, 8}, DType::f64, gpu()), w = Tensor::zeros({8}, DType::f64, gpu());
  Tensor y = Tensor::zeros({4, 8}, DType::f64, gpu()), rstd = Tensor::zeros({4}, DType::f32, gpu()), none;
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::norm_forward(y, none, rstd, x, w, none, p); }, "f64"));
  Tensor xc = Tensor::zeros({4, 8}, DType::f32), wc = Tensor::zeros({8}, DType::f32, gpu());
  Tensor yc = Tensor::zeros({4, 8}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::norm_forward(yc, none, rstd, xc, wc, none, p); }, "norm x"));
}

// The fused residual add + norm against the CPU: h bitwise (one float addition, one rounding, as
// the CPU), the rest against the CPU op in f64 on the same rounded h, with the bounds above.
TEST_F(CudaNorm, AddNormMatchesCpu) {
  uint64_t seed = 700;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    const NormParams p{kind, 1e-5f};
    const bool ln = kind == NormKind::layernorm;
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      for (const Shape2& s : kShapes) {
        const std::string what = std::string(ln ? "add+layernorm " : "add+rmsnorm ") + dtype_name(dt) +
                                 " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                                 " misalign=" + std::to_string(s.misalign);
        const Pair x = random_pair({s.N, s.C}, dt, ++seed, 2.0, s.misalign);
        const Pair r = random_pair({s.N, s.C}, dt, ++seed, 2.0, s.misalign);
        const Pair w = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
        const Pair b = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
        const Pair dy = random_pair({s.N, s.C}, dt, ++seed, 1.0, s.misalign);
        const Pair dh = random_pair({s.N, s.C}, dt, ++seed, 1.0, s.misalign);
        Pair h = poisoned_pair({s.N, s.C}, dt, s.misalign), y = poisoned_pair({s.N, s.C}, dt, s.misalign);
        Pair dx = poisoned_pair({s.N, s.C}, dt, s.misalign);
        Pair mean = poisoned_pair({s.N}, DType::f32), rstd = poisoned_pair({s.N}, DType::f32);
        Pair dw = random_pair({s.C}, DType::f32, ++seed), db = random_pair({s.C}, DType::f32, ++seed);

        Tensor gpu_mean = ln ? mean.gpu : Tensor(), gpu_db = ln ? db.gpu : Tensor();
        ops::cuda::add_norm_forward(h.gpu, y.gpu, gpu_mean, rstd.gpu, x.gpu, r.gpu, w.gpu, ln ? b.gpu : Tensor(), p);
        ops::cuda::add_norm_backward(dx.gpu, dw.gpu, gpu_db, dy.gpu, dh.gpu, h.gpu, w.gpu, gpu_mean, rstd.gpu, p);

        ops::cpu::add(h.cpu, x.cpu, r.cpu);
        EXPECT_TRUE(equals_cpu(h)) << what << " h";
        Tensor ry = poisoned({s.N, s.C}, DType::f64), rdx = poisoned({s.N, s.C}, DType::f64);
        Tensor rmean = ln ? poisoned({s.N}, DType::f64) : Tensor(), rrstd = poisoned({s.N}, DType::f64);
        Tensor rdw = f64(dw.cpu), rdb = ln ? f64(db.cpu) : Tensor();
        const Tensor hr = f64(h.cpu), wr = f64(w.cpu);
        ops::cpu::norm_forward(ry, rmean, rrstd, hr, wr, optional_f64(b, ln), p);
        ops::cpu::add_norm_backward(rdx, rdw, rdb, f64(dy.cpu), f64(dh.cpu), hr, wr, rmean, rrstd, p);

        if (ln) {
          EXPECT_TRUE(matches(mean, rmean, kUnitRoundoffF32, double(s.C) + 4)) << what << " mean";
        }
        EXPECT_TRUE(matches(rstd, rrstd, kUnitRoundoffF32, double(s.C) + 4)) << what << " rstd";
        // dx adds dh in float before its one rounding, so the plain norm's bounds hold.
        const double u = unit_roundoff(dt), factor = dt == DType::f32 ? 2.0 * double(s.C) + 8 : 2.0;
        EXPECT_TRUE(matches(y, ry, u, factor)) << what << " y";
        EXPECT_TRUE(matches(dx, rdx, u, factor)) << what << " dx";
        EXPECT_TRUE(matches(dw, rdw, kUnitRoundoffF32, 2.0 * double(s.C) + 8 + double(s.N))) << what << " dw";
        if (ln) {
          EXPECT_TRUE(matches(db, rdb, kUnitRoundoffF32, double(s.N))) << what << " db";
        }
      }
    }
  }
}

// norm_forward_fp8 writes what norm_forward's y followed by fp8_quantize_transpose writes, bit for
// bit on the GPU, from the statistics add_norm_forward computes without y: the vector path (C a
// multiple of 8), the element path (C = 99), rows not multiples of 8 or 64, a misaligned row.
TEST_F(CudaNorm, Fp8CastOfTheOutputMatchesTheUnfusedPair) {
  uint64_t seed = 900;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    const NormParams p{kind, 1e-5f};
    const bool ln = kind == NormKind::layernorm;
    for (DType dt : {DType::bf16, DType::f32})
      for (const Shape2& s : kShapes)
        for (DType q_dtype : {DType::e4m3, DType::e5m2}) {
          const std::string what = std::string(ln ? "layernorm " : "rmsnorm ") + dtype_name(dt) + " -> " +
                                   dtype_name(q_dtype) + " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                                   " misalign=" + std::to_string(s.misalign);
          const Pair x = random_pair({s.N, s.C}, dt, ++seed, 2.0, s.misalign);
          const Pair r = random_pair({s.N, s.C}, dt, ++seed, 2.0, s.misalign);
          const Pair w = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
          const Pair b = random_pair({s.C}, dt, ++seed, 1.0, s.misalign);
          const Tensor bias = ln ? b.gpu : Tensor();
          Tensor h = Tensor::empty({s.N, s.C}, dt, gpu()), y = Tensor::empty({s.N, s.C}, dt, gpu()), none;
          Tensor mean = ln ? Tensor::empty({s.N}, DType::f32, gpu()) : Tensor();
          Tensor rstd = Tensor::empty({s.N}, DType::f32, gpu());
          ops::cuda::add_norm_forward(h, none, mean, rstd, x.gpu, r.gpu, w.gpu, bias, p);
          ops::cuda::norm_forward(y, mean, rstd, h, w.gpu, bias, p);
          const Tensor scale = Tensor::from_vector({37.0f}, {1}).to(gpu());
          Tensor q = Tensor::empty({s.N, s.C}, q_dtype, gpu()), q_t = Tensor::empty({s.C, s.N}, q_dtype, gpu());
          Tensor uq = Tensor::empty({s.N, s.C}, q_dtype, gpu()), uq_t = Tensor::empty({s.C, s.N}, q_dtype, gpu());
          Tensor amax = Tensor::zeros({1}, DType::f32, gpu()), unfused_amax = Tensor::zeros({1}, DType::f32, gpu());
          ops::cuda::norm_forward_fp8(q, q_t, amax, h, w.gpu, bias, mean, rstd, p, scale);
          ops::cuda::fp8_quantize_transpose(uq, uq_t, unfused_amax, y, scale);
          const auto same = [](const Tensor& actual, const Tensor& want) {
            const Tensor ha = actual.to(Device::cpu()), hb = want.to(Device::cpu());
            return std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
          };
          EXPECT_TRUE(same(q, uq)) << what << " q";
          EXPECT_TRUE(same(q_t, uq_t)) << what << " q_t";
          EXPECT_EQ(amax.item(), unfused_amax.item()) << what;
        }
  }
}
