// FP8 on CUDA against the CPU oracle: the cast kernel bit for bit (the hardware's cvt.rn.satfinite
// against core/dtype.h's rounding), amax and the recipes' scale update exactly, and the cuBLASLt
// FP8 GEMM both against the CPU's emulation of it on the same FP8 bytes and against a BF16 GEMM of
// the unquantised values, each within a derived bound; the same for the blockwise recipe's cast
// (codes and block scales bit for bit) and its block-scaled GEMM.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/fp8.h"
#include "megatron/ops/gemm.h"

using namespace megatron;
using namespace megatron::test;
using ops::MatmulParams;
using ops::Transpose;

namespace {

class CudaFp8 : public CudaTest {};

Tensor scalar(float v, Device device = Device::cpu()) { return Tensor::from_vector({v}, {1}).to(device); }

// A host FP8 tensor of NaN codes (0x7F): an element the kernel forgets to write shows.
Tensor nan_fp8(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memset(t.raw(), 0x7F, t.nbytes());
  return t;
}

::testing::AssertionResult same_bytes(const Pair& out) {
  const Tensor actual = out.gpu.to(Device::cpu());
  const auto* a = static_cast<const uint8_t*>(actual.raw());
  const auto* r = static_cast<const uint8_t*>(out.cpu.raw());
  for (int64_t i = 0; i < actual.numel(); ++i)
    if (a[i] != r[i])
      return ::testing::AssertionFailure()
             << "byte " << i << ": GPU 0x" << std::hex << int(a[i]) << ", CPU 0x" << int(r[i]);
  return out.guards_intact();
}

// Values over the whole FP8 range and beyond: N(0,1) times 2^(i mod 48 - 24), so each format's
// subnormals, normals and saturation all occur, plus the hand-worked ties and infinities.
Tensor wide_values(int64_t n, DType dtype, uint64_t seed) {
  const Tensor r = randn({n}, DType::f32, seed);
  Tensor x = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) x.set_item(i, std::ldexp(r.item(i), int(i % 48) - 24));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {1.0625f,      1.1875f, 0x1p-10f, 3 * 0x1p-10f, 1.125f, 1.375f, 0x1p-17f,
                                      3 * 0x1p-17f, 470.0f,  61440.0f, inf,          -inf,   0.0f,   -0.0f};
  for (size_t i = 0; i < special.size() && int64_t(i) < n; ++i) x.set_item(int64_t(i), special[i]);
  return x.to(dtype);
}

void check_cast(DType x_dtype, DType q_dtype, float scale, int64_t n, int64_t misalign) {
  const Pair x = pair_of(wide_values(n, x_dtype, 11), misalign);
  Pair q = pair_of(nan_fp8({n}, q_dtype), misalign);
  Pair amax = pair_of(scalar(0.25f));
  const Pair s = pair_of(scalar(scale));
  ops::cpu::fp8_quantize(q.cpu, amax.cpu, x.cpu, s.cpu);
  ops::cuda::fp8_quantize(q.gpu, amax.gpu, x.gpu, s.gpu);
  EXPECT_TRUE(same_bytes(q)) << dtype_name(x_dtype) << " -> " << dtype_name(q_dtype) << ", scale " << scale;
  EXPECT_TRUE(equals_cpu(amax));
}

}  // namespace

TEST_F(CudaFp8, CastMatchesCpuBitForBit) {
  for (DType q : {DType::e4m3, DType::e5m2})
    for (DType x : {DType::f32, DType::bf16, DType::f16})
      for (float scale : {1.0f, 3.7f, 0x1p-7f}) {
        check_cast(x, q, scale, 4099, 0);
        check_cast(x, q, scale, 1001, 1);  // odd size, misaligned view
      }
}

// The cast-transpose kernel (64 x 64 tiles, 8-element segments) against the CPU, bit for bit:
// shapes of whole tiles, ragged edges, rows or columns not multiples of 8 (the element-wise
// paths), with and without the untransposed copy.
TEST_F(CudaFp8, QuantizeTransposeMatchesCpuBitForBit) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{128, 256}, {136, 200}, {67, 45}, {200, 24}, {64, 72}, {9, 130}})
    for (DType x_dtype : {DType::f32, DType::bf16})
      for (DType q_dtype : {DType::e4m3, DType::e5m2})
        for (bool with_rows : {false, true}) {
          const Pair x = pair_of(wide_values(rows * cols, x_dtype, 5).view({rows, cols}));
          Pair q_t = pair_of(nan_fp8({cols, rows}, q_dtype)), amax = pair_of(scalar(0.25f));
          Pair q = pair_of(nan_fp8({rows, cols}, q_dtype));
          const Pair s = pair_of(scalar(2.5f));
          Tensor none;
          ops::cpu::fp8_quantize_transpose(with_rows ? q.cpu : none, q_t.cpu, amax.cpu, x.cpu, s.cpu);
          ops::cuda::fp8_quantize_transpose(with_rows ? q.gpu : none, q_t.gpu, amax.gpu, x.gpu, s.gpu);
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(x_dtype) +
                                   " -> " + dtype_name(q_dtype) + (with_rows ? ", with rows" : "");
          EXPECT_TRUE(same_bytes(q_t)) << what;
          if (with_rows) {
            EXPECT_TRUE(same_bytes(q)) << what;
          }
          EXPECT_TRUE(equals_cpu(amax)) << what;
        }
}

TEST_F(CudaFp8, AmaxAndScaleUpdateMatchCpu) {
  const Pair x = pair_of(wide_values(70000, DType::bf16, 3));
  Pair amax = pair_of(scalar(0.5f));
  ops::cpu::fp8_amax(amax.cpu, x.cpu);
  ops::cuda::fp8_amax(amax.gpu, x.gpu);
  EXPECT_TRUE(equals_cpu(amax));
  // Histories of 1, 5 (hand-picked) and 1024 (Megatron's usual length: the block's threads loop).
  for (const int64_t len : {1, 5, 1024})
    for (const auto algo : {ops::AmaxComputeAlgo::most_recent, ops::AmaxComputeAlgo::max})
      for (DType dtype : {DType::e4m3, DType::e5m2}) {
        const ops::Fp8Recipe recipe{.amax_history_len = len, .amax_compute_algo = algo, .margin = 2};
        Pair scale = pair_of(scalar(3.0f)), scale_inv = pair_of(scalar(1.0f / 3.0f));
        Pair history = pair_of(len == 5 ? Tensor::from_vector({1.5f, 7.25f, 0.0f, 300.0f, 0.001f}, {5})
                                        : randn({len}, DType::f32, 17));
        for (int step = 0; step < 6; ++step) {
          ops::cpu::fp8_update_scale(scale.cpu, scale_inv.cpu, history.cpu, dtype, recipe);
          ops::cuda::fp8_update_scale(scale.gpu, scale_inv.gpu, history.gpu, dtype, recipe);
          EXPECT_TRUE(equals_cpu(scale));
          EXPECT_TRUE(equals_cpu(scale_inv));
          EXPECT_TRUE(equals_cpu(history));
        }
      }
}

// 70 tensors in one call (two launches: 64 a batch), of both dtypes, some histories without an
// amax: the same bytes as the CPU's update of each.
TEST_F(CudaFp8, BatchedScaleUpdateMatchesCpu) {
  const ops::Fp8Recipe recipe{.amax_history_len = 1024, .amax_compute_algo = ops::AmaxComputeAlgo::max, .margin = 1};
  std::vector<Tensor> scales[2], scale_invs[2], histories[2];  // [0] CPU, [1] GPU
  std::vector<DType> dtypes;
  for (int i = 0; i < 70; ++i) {
    const Tensor history = i % 7 == 3 ? Tensor::zeros({1024}, DType::f32) : randn({1024}, DType::f32, 100 + i);
    const Tensor scale = scalar(float(i + 1)), scale_inv = scalar(1.0f / float(i + 1));
    for (int side = 0; side < 2; ++side) {
      const Device device = side == 0 ? Device::cpu() : gpu();
      scales[side].push_back(scale.to(device).clone());
      scale_invs[side].push_back(scale_inv.to(device).clone());
      histories[side].push_back(history.to(device).clone());
    }
    dtypes.push_back(i % 2 == 0 ? DType::e4m3 : DType::e5m2);
  }
  for (int step = 0; step < 3; ++step) {
    ops::cpu::fp8_update_scales(scales[0], scale_invs[0], histories[0], dtypes, recipe);
    ops::cuda::fp8_update_scales(scales[1], scale_invs[1], histories[1], dtypes, recipe);
  }
  for (size_t i = 0; i < dtypes.size(); ++i) {  // finite values: equal floats are equal bytes
    EXPECT_EQ(scales[1][i].to(Device::cpu()).to_vector(), scales[0][i].to_vector()) << i;
    EXPECT_EQ(scale_invs[1][i].to(Device::cpu()).to_vector(), scale_invs[0][i].to_vector()) << i;
    EXPECT_EQ(histories[1][i].to(Device::cpu()).to_vector(), histories[0][i].to_vector()) << i;
  }
}

namespace {

struct GemmCase {
  DType a_dtype, b_dtype, out;
  bool ta, tb;
  int64_t m, n, k;
  float beta;
  bool fast_accumulation = false;
};

// Current scaling of a bf16 operand on the GPU: scale = fp8_max / amax, then the cast.
struct Quantized {
  Tensor q, scale_inv;
};
Quantized quantize_on_gpu(const Tensor& x, DType dtype) {
  Tensor history = Tensor::zeros({1}, DType::f32, gpu()), scale = scalar(1.0f, gpu()), scale_inv = scalar(1.0f, gpu()),
         amax = history.slice(0, 1), none;
  ops::cuda::fp8_amax(amax, x);
  ops::cuda::fp8_update_scale(scale, scale_inv, history, dtype, {});
  Tensor q = Tensor::empty(x.shape(), dtype, gpu());
  ops::cuda::fp8_quantize(q, none, x, scale);
  return {q, scale_inv};
}

// The unit roundoff of a format with p mantissa bits: 2^-(p+1); e4m3 2^-4, e5m2 2^-3.
double fp8_unit_roundoff(DType dtype) { return dtype == DType::e4m3 ? 0x1p-4 : 0x1p-3; }

// An FP8 GEMM C = op(A) op(B) (+ beta C) the GPU ran, for the two comparisons below.
struct Fp8Gemm {
  DType a_dtype, b_dtype, out;
  int64_t k;
  float beta;
  MatmulParams params;
  Tensor a, b;                              // the unquantised bf16 operands (CPU)
  Tensor a_codes, b_codes;                  // their FP8 casts, read back from the GPU
  double a_scale_inv_max, b_scale_inv_max;  // the largest scale_inv of each (per tensor: the one)
  // The CPU's emulation of the GEMM on codes of A and B with their scales: c = op(A) op(B) + c
  // under `params` (alpha 1, beta 1).
  std::function<void(Tensor& c, const Tensor& a_codes, const Tensor& b_codes, const MatmulParams& params)> emulate;
};

// (1) Against the CPU emulation on the same FP8 bytes and scales: only the accumulation differs.
// Hopper's FP8 tensor cores add the products inside each MMA at about 14 bits, not f32 (the
// DeepSeek-V3 report, section 3.3.2; measured here: 1.5e-3 where the f32 bound allowed 9e-4),
// and cuBLASLt (fast accumulation off) adds those partial sums in f32 (block-scaled: at least once
// per 128-long K block, to apply the scales). Each partial is within 2^-14 of its products'
// absolute sum, so together within 2^-14 S, S the product of the absolute values (+ |beta C|);
// doubled for margin, plus test_cuda_gemm.cpp's f32 bound 2 (K + 2) u32 S, then one rounding of a
// 16-bit output. With fast accumulation (the forward's) the running sum itself goes through that
// ~14-bit addition once per MMA K step of 32: within ceil(K / 32) 2^-14 S, doubled as above.
// (2) Against the BF16 GEMM of the unquantised values (f64 on the CPU): each operand element is
// within u |x| + d of its FP8 value, u the format's unit roundoff (2^-4 e4m3, 2^-3 e5m2; e4m3
// keeps 3 mantissa bits) and d half the subnormal spacing over the scale (2^-10 or 2^-17 times
// the largest scale_inv of its operand, for elements below the smallest normal). Per product
// |ab - a'b'| <= (ua + ub + ua ub) |a||b| + d_a |b| (1 + ub) + d_b |a| (1 + ua) + d_a d_b, summed
// over K, plus (1)'s bound.
void expect_within_fp8_gemm_bounds(const Pair& out, const Tensor& c_before, const Fp8Gemm& g, const std::string& what) {
  const int64_t m = c_before.dim(0), n = c_before.dim(1);
  const MatmulParams& p = g.params;
  Tensor emulated = c_before.to(DType::f32);
  g.emulate(emulated, g.a_codes, g.b_codes, {p.trans_a, p.trans_b, 1.0f, g.beta});
  // S from the dequantised values: |a_scale_inv A| |b_scale_inv B| through the emulated GEMM on
  // absolute values (clearing the sign bit of an FP8 code takes its absolute value).
  Tensor abs_aq = g.a_codes.clone(), abs_bq = g.b_codes.clone();
  for (Tensor* t : {&abs_aq, &abs_bq})
    for (int64_t i = 0; i < t->numel(); ++i) static_cast<uint8_t*>(t->raw())[i] &= 0x7F;
  Tensor s = g.beta == 0.0f ? Tensor::zeros({m, n}, DType::f32) : abs_f64(c_before).to(DType::f32);
  g.emulate(s, abs_aq, abs_bq, {p.trans_a, p.trans_b, 1.0f, 1.0f});
  const double u16 = g.out == DType::f32 ? 0.0 : unit_roundoff(g.out);
  Tensor bound = Tensor::empty({m, n}, DType::f64);
  for (int64_t i = 0; i < bound.numel(); ++i) {
    const double mma = p.fp8_fast_accumulation ? double((g.k + 31) / 32) * 0x1p-13 : 0x1p-13;
    const double e = (mma + 2.0 * double(g.k + 2) * kUnitRoundoffF32) * s.item(i);
    bound.set_item(i, e * (1.0 + u16) + u16 * std::fabs(emulated.item(i)) + 1e-30);
  }
  EXPECT_TRUE(within_bound(out, emulated, bound)) << "vs CPU emulation, " << what;

  Tensor ref = f64(c_before);
  ops::cpu::matmul(ref, f64(g.a), f64(g.b), {p.trans_a, p.trans_b, 1.0f, g.beta});
  Tensor abs_ab = Tensor::zeros({m, n}, DType::f64);
  ops::cpu::matmul(abs_ab, abs_f64(g.a), abs_f64(g.b), {p.trans_a, p.trans_b, 1.0f, 0.0f});
  const double ua = fp8_unit_roundoff(g.a_dtype), ub = fp8_unit_roundoff(g.b_dtype);
  const auto half_subnormal = [](DType d, double scale_inv) {
    return (d == DType::e4m3 ? 0x1p-10 : 0x1p-17) * scale_inv;
  };
  const double da = half_subnormal(g.a_dtype, g.a_scale_inv_max), db = half_subnormal(g.b_dtype, g.b_scale_inv_max);
  const double max_a = max_abs(g.a), max_b = max_abs(g.b);
  Tensor bound2 = Tensor::empty({m, n}, DType::f64);
  for (int64_t i = 0; i < bound2.numel(); ++i) {
    const double quantisation =
        (ua + ub + ua * ub) * abs_ab.item(i) + double(g.k) * (da * max_b * (1 + ub) + db * max_a * (1 + ua) + da * db);
    bound2.set_item(i, quantisation * (1.0 + u16) + bound.item(i));
  }
  EXPECT_TRUE(within_bound(out, ref, bound2)) << "vs BF16 reference, " << what;
  // The typical error is far below that worst case: normwise about u / sqrt(3) per operand (a
  // uniform rounding error), not u. Printed, so a regression towards the bound is visible.
  std::printf("fp8 GEMM %s: normwise error vs BF16 %.4f (bound per element (ua + ub) = %.4f)\n", what.c_str(),
              normwise_error(out.gpu.to(Device::cpu()), ref), ua + ub);
}

void check_gemm(const GemmCase& c, uint64_t seed) {
  const Shape a_shape = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
  const Shape b_shape = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
  const Pair a = random_pair(a_shape, DType::bf16, seed), b = random_pair(b_shape, DType::bf16, seed + 1);
  Pair out = c.beta == 0.0f ? poisoned_pair({c.m, c.n}, c.out) : random_pair({c.m, c.n}, c.out, seed + 2);
  const MatmulParams p{c.ta ? Transpose::yes : Transpose::no, c.tb ? Transpose::yes : Transpose::no, 1.0f, c.beta,
                       c.fast_accumulation};
  const Quantized qa = quantize_on_gpu(a.gpu, c.a_dtype), qb = quantize_on_gpu(b.gpu, c.b_dtype);
  const Tensor c_before = out.cpu.clone();
  ops::fp8_matmul(out.gpu, qa.q, qa.scale_inv, qb.q, qb.scale_inv, p);
  const std::string what = std::string(dtype_name(c.a_dtype)) + " x " + dtype_name(c.b_dtype) + " -> " +
                           dtype_name(c.out) + (c.ta ? ", A^T" : "") + (c.tb ? ", B^T" : "") +
                           (c.beta != 0.0f ? ", accumulated" : "") + (c.fast_accumulation ? ", fast accumulation" : "");

  const Tensor sa = qa.scale_inv.to(Device::cpu()), sb = qb.scale_inv.to(Device::cpu());
  const Fp8Gemm g{c.a_dtype,
                  c.b_dtype,
                  c.out,
                  c.k,
                  c.beta,
                  p,
                  a.cpu,
                  b.cpu,
                  qa.q.to(Device::cpu()),
                  qb.q.to(Device::cpu()),
                  sa.item(),
                  sb.item(),
                  [&](Tensor& out_c, const Tensor& a_codes, const Tensor& b_codes, const MatmulParams& params) {
                    ops::cpu::fp8_matmul(out_c, a_codes, sa, b_codes, sb, params);
                  }};
  expect_within_fp8_gemm_bounds(out, c_before, g, what);
}

}  // namespace

TEST_F(CudaFp8, GemmMatchesEmulationAndBf16Reference) {
  uint64_t seed = 100;
  const int64_t m = 64, n = 48, k = 96;
  for (bool ta : {false, true})
    for (bool tb : {true, false}) {
      check_gemm({DType::e4m3, DType::e4m3, DType::bf16, ta, tb, m, n, k, 0.0f}, seed++);  // forward
      check_gemm({DType::e5m2, DType::e4m3, DType::bf16, ta, tb, m, n, k, 0.0f}, seed++);  // hybrid dgrad
    }
  // The weight gradient: dy^T (e5m2) x (e4m3) accumulated into an f32 main grad.
  check_gemm({DType::e5m2, DType::e4m3, DType::f32, true, false, m, n, k, 1.0f}, seed++);
  // A model-sized GEMM (a llama-1b MLP tile).
  check_gemm({DType::e4m3, DType::e4m3, DType::bf16, false, true, 256, 2048, 2048, 0.0f}, seed++);
  // The forward's fast accumulation (Fp8Linear's fprop), short and model-sized K.
  check_gemm({DType::e4m3, DType::e4m3, DType::bf16, false, true, m, n, k, 0.0f, true}, seed++);
  check_gemm({DType::e4m3, DType::e4m3, DType::bf16, false, true, 256, 2048, 2048, 0.0f, true}, seed++);
}

TEST_F(CudaFp8, GemmRefusesSizesCublasLtCannotRun) {
  Tensor a = Tensor::zeros({16, 24}, DType::e4m3, gpu()), b = Tensor::zeros({16, 24}, DType::e4m3, gpu());
  Tensor c = Tensor::empty({16, 16}, DType::bf16, gpu()), s = scalar(1.0f, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::fp8_matmul(c, a, s, b, s, {.trans_b = Transpose::yes}); },
                                  "need K and C's column count to be positive multiples of 16"));
}

// ---- blockwise ----

namespace {

using ops::Fp8BlockShape;

const char* block_name(Fp8BlockShape blocks) { return blocks == Fp8BlockShape::tile_1x128 ? "1x128" : "128x128"; }

// An f32 host tensor of NaNs: a scale (or padding) the kernel forgets to write shows.
Tensor nan_f32(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  t.fill(std::numeric_limits<double>::quiet_NaN());
  return t;
}

}  // namespace

// The blockwise cast against the CPU, bit for bit: codes of both layouts and every scale_inv
// (padding included) for both block shapes, three input dtypes, both formats; shapes of whole
// blocks, ragged ones, fewer than 8 rows (a partial tile-kernel block), a zero row; values over the
// whole range with infinities (a block whose amax is infinite keeps scale 1).
TEST_F(CudaFp8, BlockwiseCastMatchesCpuBitForBit) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{256, 384}, {130, 200}, {7, 129}, {300, 16}})
    for (const Fp8BlockShape blocks : {Fp8BlockShape::tile_1x128, Fp8BlockShape::block_128x128})
      for (DType x_dtype : {DType::f32, DType::bf16, DType::f16})
        for (DType q_dtype : {DType::e4m3, DType::e5m2}) {
          Tensor host = wide_values(rows * cols, DType::f32, 9).view({rows, cols});
          for (int64_t c = 0; c < cols; ++c) host.set_item(3 * cols + c, 0.0);  // a zero row: scale 1
          const Pair x = pair_of(host.to(x_dtype));
          Pair q = pair_of(nan_fp8({rows, cols}, q_dtype)), q_t = pair_of(nan_fp8({cols, rows}, q_dtype));
          Pair s = pair_of(nan_f32(ops::fp8_block_scale_shape(rows, cols, blocks)));
          Pair s_t = pair_of(nan_f32(ops::fp8_block_scale_shape(cols, rows, blocks)));
          ops::cpu::fp8_quantize_blockwise(q.cpu, s.cpu, q_t.cpu, s_t.cpu, x.cpu, blocks);
          ops::cuda::fp8_quantize_blockwise(q.gpu, s.gpu, q_t.gpu, s_t.gpu, x.gpu, blocks);
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + block_name(blocks) + " " +
                                   dtype_name(x_dtype) + " -> " + dtype_name(q_dtype);
          EXPECT_TRUE(same_bytes(q)) << what;
          EXPECT_TRUE(same_bytes(q_t)) << what;
          EXPECT_TRUE(equals_cpu(s)) << what;
          EXPECT_TRUE(equals_cpu(s_t)) << what;
        }
  // One layout only: the other stays unwritten.
  const Pair x = random_pair({128, 256}, DType::bf16, 4);
  Pair q_t = pair_of(nan_fp8({256, 128}, DType::e4m3));
  Pair s_t = pair_of(nan_f32(ops::fp8_block_scale_shape(256, 128, Fp8BlockShape::tile_1x128)));
  Tensor none;
  ops::cpu::fp8_quantize_blockwise(none, none, q_t.cpu, s_t.cpu, x.cpu, Fp8BlockShape::tile_1x128);
  ops::cuda::fp8_quantize_blockwise(none, none, q_t.gpu, s_t.gpu, x.gpu, Fp8BlockShape::tile_1x128);
  EXPECT_TRUE(same_bytes(q_t));
  EXPECT_TRUE(equals_cpu(s_t));
}

namespace {

struct BlockGemmCase {
  DType a_dtype, b_dtype, out;
  Fp8BlockShape a_blocks, b_blocks;
  int64_t m, n, k;
  float beta;
};

// The block-scaled GEMM C = A B^T (+ beta C), A (m,k) and B (n,k) cast on the GPU in their blocks,
// held to expect_within_fp8_gemm_bounds's two comparisons (its d from the largest block scale_inv
// of each operand, which bounds every block's own).
void check_block_gemm(const BlockGemmCase& c, uint64_t seed) {
  const Pair a = random_pair({c.m, c.k}, DType::bf16, seed), b = random_pair({c.n, c.k}, DType::bf16, seed + 1);
  Pair out = c.beta == 0.0f ? poisoned_pair({c.m, c.n}, c.out) : random_pair({c.m, c.n}, c.out, seed + 2);
  const auto cast = [](const Tensor& x, DType dtype, Fp8BlockShape blocks) {
    std::pair<Tensor, Tensor> q{
        Tensor::empty(x.shape(), dtype, gpu()),
        Tensor::empty(ops::fp8_block_scale_shape(x.dim(0), x.dim(1), blocks), DType::f32, gpu())};
    Tensor none, none_scale;
    ops::cuda::fp8_quantize_blockwise(q.first, q.second, none, none_scale, x, blocks);
    return q;
  };
  const auto [qa, sa_gpu] = cast(a.gpu, c.a_dtype, c.a_blocks);
  const auto [qb, sb_gpu] = cast(b.gpu, c.b_dtype, c.b_blocks);
  const MatmulParams p{.trans_b = Transpose::yes, .beta = c.beta};
  const Tensor c_before = out.cpu.clone();
  ops::fp8_matmul_blockwise(out.gpu, qa, sa_gpu, c.a_blocks, qb, sb_gpu, c.b_blocks, p);
  const std::string what = std::string(dtype_name(c.a_dtype)) + " " + block_name(c.a_blocks) + " x " +
                           dtype_name(c.b_dtype) + " " + block_name(c.b_blocks) + " -> " + dtype_name(c.out) + " (" +
                           std::to_string(c.m) + "," + std::to_string(c.n) + "," + std::to_string(c.k) + ")" +
                           (c.beta != 0.0f ? ", accumulated" : "");

  const Tensor sa = sa_gpu.to(Device::cpu()), sb = sb_gpu.to(Device::cpu());
  const Fp8Gemm g{c.a_dtype,
                  c.b_dtype,
                  c.out,
                  c.k,
                  c.beta,
                  p,
                  a.cpu,
                  b.cpu,
                  qa.to(Device::cpu()),
                  qb.to(Device::cpu()),
                  max_abs(sa),
                  max_abs(sb),
                  [&](Tensor& out_c, const Tensor& a_codes, const Tensor& b_codes, const MatmulParams& params) {
                    ops::cpu::fp8_matmul_blockwise(out_c, a_codes, sa, c.a_blocks, b_codes, sb, c.b_blocks, params);
                  }};
  expect_within_fp8_gemm_bounds(out, c_before, g, "blockwise " + what);
}

}  // namespace

// The three GEMMs of a blockwise Fp8Linear (forward, hybrid dgrad, wgrad into an f32 main grad)
// and cuBLASLt's third pair (128x128 A, 1x128 B), at sizes of whole 128 blocks, and a model-sized
// one (a llama-1b MLP tile).
TEST_F(CudaFp8, BlockwiseGemmMatchesEmulationAndBf16Reference) {
  const Fp8BlockShape tile = Fp8BlockShape::tile_1x128, block = Fp8BlockShape::block_128x128;
  uint64_t seed = 300;
  check_block_gemm({DType::e4m3, DType::e4m3, DType::bf16, tile, block, 256, 384, 512, 0.0f}, seed++);
  check_block_gemm({DType::e5m2, DType::e4m3, DType::bf16, tile, block, 256, 384, 512, 0.0f}, seed++);
  check_block_gemm({DType::e5m2, DType::e4m3, DType::f32, tile, tile, 256, 384, 512, 1.0f}, seed++);
  check_block_gemm({DType::e4m3, DType::e4m3, DType::bf16, block, tile, 384, 256, 512, 0.0f}, seed++);
  check_block_gemm({DType::e4m3, DType::e4m3, DType::bf16, tile, block, 256, 2048, 2048, 0.0f}, seed++);
}

// Sizes that are not multiples of 128 (ragged last blocks, K and N multiples of 16 as every FP8
// GEMM here needs): the scales' layout covers them; whether cuBLASLt runs them is what this asks.
TEST_F(CudaFp8, BlockwiseGemmOnRaggedBlocks) {
  const Fp8BlockShape tile = Fp8BlockShape::tile_1x128, block = Fp8BlockShape::block_128x128;
  check_block_gemm({DType::e4m3, DType::e4m3, DType::bf16, tile, block, 200, 144, 272, 0.0f}, 400);
  check_block_gemm({DType::e5m2, DType::e4m3, DType::f32, tile, tile, 200, 144, 272, 1.0f}, 401);
}
