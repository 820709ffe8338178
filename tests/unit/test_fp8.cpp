// FP8 on the CPU: the e4m3/e5m2 rounding on hand-worked values (ties to even, subnormals,
// saturation), the quantiser and its amax, the delayed and current scaling recipes step by step,
// the emulated FP8 GEMM on exactly representable operands, and a linear layer's FP8 GEMMs and the
// recipe state it saves and loads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/core/error.h"
#include "megatron/ops/fp8.h"
#include "megatron/ops/gemm.h"
#include "megatron/tensor_parallel/fp8_linear.h"
#include "op_test_util.h"

using namespace megatron;

namespace {

std::vector<uint8_t> bits_of(const Tensor& q) {
  const auto* p = static_cast<const uint8_t*>(q.raw());
  return {p, p + q.numel()};
}

Tensor scalar(float v) { return Tensor::from_vector({v}, {1}); }

// Values of both signs whose magnitude grows with the step, so every step records other amaxes.
Tensor wave(const Shape& shape, int step, float phase) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(1 + step) * std::sin(phase + 0.37f * float(i) + float(step));
  return Tensor::from_vector(v, shape, DType::bf16);
}

struct StepOutputs {
  Tensor y, dx, dweight;
};

// One optimizer step of a layer: forward, backward (dx and dW), then the recipe's update.
StepOutputs fp8_step(tensor_parallel::Fp8Linear& fp8, int step) {
  const Tensor x = wave({4, 16}, step, 0.1f), w = wave({16, 16}, step, 1.3f), dy = wave({4, 16}, step, 2.9f);
  StepOutputs out{Tensor::empty({4, 16}, DType::bf16), Tensor::empty({4, 16}, DType::bf16),
                  Tensor::zeros({16, 16}, DType::f32)};
  Tensor no_bias;
  fp8.linear_forward(out.y, x, w, no_bias);
  fp8.linear_backward(out.dx, out.dweight, no_bias, dy, x, w, ops::GradWrite::accumulate);
  fp8.update_scales();
  return out;
}

void expect_same_bits(const StepOutputs& a, const StepOutputs& b, int step) {
  EXPECT_EQ(a.y.to_vector(), b.y.to_vector()) << "step " << step;
  EXPECT_EQ(a.dx.to_vector(), b.dx.to_vector()) << "step " << step;
  EXPECT_EQ(a.dweight.to_vector(), b.dweight.to_vector()) << "step " << step;
}

}  // namespace

// e4m3: bias 7, 3 mantissa bits; normals 2^-6 .. 448, subnormals k * 2^-9.
TEST(Fp8Format, E4m3HandWorked) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp8_e4m3::from_float(1.0f), 0x38);     // 0.0111.000
  EXPECT_EQ(fp8_e4m3::from_float(-2.0f), 0xC0);    // 1.1000.000
  EXPECT_EQ(fp8_e4m3::from_float(-6.0f), 0xCC);    // -1.5 * 2^2: 1.1001.100
  EXPECT_EQ(fp8_e4m3::from_float(1.0625f), 0x38);  // tie between 1 (000) and 1.125 (001): even, 1
  EXPECT_EQ(fp8_e4m3::from_float(1.1875f), 0x3A);  // tie between 1.125 (001) and 1.25 (010): even, 1.25
  EXPECT_EQ(fp8_e4m3::from_float(1.07f), 0x39);    // above the tie: 1.125
  EXPECT_EQ(fp8_e4m3::from_float(448.0f), 0x7E);   // the max, 1.75 * 2^8
  EXPECT_EQ(fp8_e4m3::from_float(470.0f), 0x7E);   // rounds towards 480 (the NaN code): saturates
  EXPECT_EQ(fp8_e4m3::from_float(1e6f), 0x7E);
  EXPECT_EQ(fp8_e4m3::from_float(inf), 0x7E);  // satfinite: infinity saturates too
  EXPECT_EQ(fp8_e4m3::from_float(-inf), 0xFE);
  EXPECT_EQ(fp8_e4m3::from_float(std::nanf("")), 0x7F);
  EXPECT_EQ(fp8_e4m3::from_float(0x1p-6f), 0x08);        // smallest normal
  EXPECT_EQ(fp8_e4m3::from_float(7 * 0x1p-9f), 0x07);    // largest subnormal
  EXPECT_EQ(fp8_e4m3::from_float(0x1p-9f), 0x01);        // smallest subnormal
  EXPECT_EQ(fp8_e4m3::from_float(0x1p-10f), 0x00);       // tie between 0 and 2^-9: even, 0
  EXPECT_EQ(fp8_e4m3::from_float(-0x1p-10f), 0x80);      // the sign survives: -0
  EXPECT_EQ(fp8_e4m3::from_float(3 * 0x1p-10f), 0x02);   // tie between 2^-9 (001) and 2^-8 (010): even
  EXPECT_EQ(fp8_e4m3::from_float(15 * 0x1p-10f), 0x08);  // tie between 7 * 2^-9 and 2^-6: even, the normal
  EXPECT_EQ(fp8_e4m3::to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3::to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(fp8_e4m3::to_float(0xFF)));
}

// e5m2: bias 15, 2 mantissa bits; normals 2^-14 .. 57344, subnormals k * 2^-16, IEEE infinities.
TEST(Fp8Format, E5m2HandWorked) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp8_e5m2::from_float(1.0f), 0x3C);      // 0.01111.00
  EXPECT_EQ(fp8_e5m2::from_float(1.125f), 0x3C);    // tie between 1 (00) and 1.25 (01): even, 1
  EXPECT_EQ(fp8_e5m2::from_float(1.375f), 0x3E);    // tie between 1.25 (01) and 1.5 (10): even, 1.5
  EXPECT_EQ(fp8_e5m2::from_float(57344.0f), 0x7B);  // the max, 1.75 * 2^15
  EXPECT_EQ(fp8_e5m2::from_float(60000.0f), 0x7B);
  EXPECT_EQ(fp8_e5m2::from_float(inf), 0x7B);  // satfinite: no infinity comes out
  EXPECT_EQ(fp8_e5m2::from_float(-1e30f), 0xFB);
  EXPECT_EQ(fp8_e5m2::from_float(std::nanf("")), 0x7F);
  EXPECT_EQ(fp8_e5m2::from_float(0x1p-14f), 0x04);  // smallest normal
  EXPECT_EQ(fp8_e5m2::from_float(0x1p-16f), 0x01);  // smallest subnormal
  EXPECT_EQ(fp8_e5m2::from_float(0x1p-17f), 0x00);  // tie: even, 0
  EXPECT_EQ(fp8_e5m2::from_float(3 * 0x1p-17f), 0x02);
  EXPECT_EQ(fp8_e5m2::to_float(0x7C), inf);
  EXPECT_EQ(fp8_e5m2::to_float(0x7B), 57344.0f);
}

// Every finite code decodes to a value that encodes back to it.
TEST(Fp8Format, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const auto b = uint8_t(code);
    const float e4 = fp8_e4m3::to_float(b), e5 = fp8_e5m2::to_float(b);
    if (!std::isnan(e4)) {
      EXPECT_EQ(fp8_e4m3::from_float(e4), b) << code;
    }
    if (std::isfinite(e5)) {
      EXPECT_EQ(fp8_e5m2::from_float(e5), b) << code;
    }
  }
}

TEST(Fp8Ops, QuantizeScalesRoundsAndRecordsAmax) {
  const Tensor x = Tensor::from_vector({1.0f, -3.0f, 0.5f, 1000.0f}, {4});
  Tensor q = Tensor::empty({4}, DType::e4m3), amax = scalar(0.5f);
  ops::fp8_quantize(q, amax, x, scalar(2.0f));
  // 2, -6, 1 and 2000 (saturated to 448)
  EXPECT_EQ(bits_of(q), (std::vector<uint8_t>{0x40, 0xCC, 0x38, 0x7E}));
  EXPECT_EQ(amax.item(), 1000.0);
  Tensor big = scalar(5000.0f);
  ops::fp8_amax(big, x);
  EXPECT_EQ(big.item(), 5000.0);  // a running max
  Tensor nan_amax = scalar(1.0f);
  ops::fp8_amax(nan_amax, Tensor::from_vector({1.0f, std::nanf("")}, {2}));
  EXPECT_TRUE(std::isnan(nan_amax.item()));  // NaN reaches the scale update, which then keeps its scale
}

// The cast-transpose is the cast, transposed: against fp8_quantize's bytes read column by column,
// with and without the untransposed copy, and the same amax either way.
TEST(Fp8Ops, QuantizeTransposeIsTheCastTransposed) {
  const int64_t rows = 5, cols = 3;
  const Tensor x = wave({rows, cols}, 2, 0.4f);
  Tensor q = Tensor::empty({rows, cols}, DType::e5m2), amax = scalar(0.0f);
  ops::fp8_quantize(q, amax, x, scalar(3.0f));
  const std::vector<uint8_t> cast = bits_of(q);
  for (bool with_rows : {false, true}) {
    Tensor q_rows = with_rows ? Tensor::empty({rows, cols}, DType::e5m2) : Tensor();
    Tensor q_t = Tensor::empty({cols, rows}, DType::e5m2), amax_t = scalar(0.0f);
    ops::fp8_quantize_transpose(q_rows, q_t, amax_t, x, scalar(3.0f));
    const std::vector<uint8_t> t = bits_of(q_t);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(t[size_t(c * rows + r)], cast[size_t(r * cols + c)]) << r << "," << c;
    if (with_rows) {
      EXPECT_EQ(bits_of(q_rows), cast);
    }
    EXPECT_EQ(amax_t.item(), amax.item());
  }
  Tensor none, wrong = Tensor::empty({rows, cols}, DType::e5m2);
  EXPECT_THROW(ops::fp8_quantize_transpose(none, wrong, none, x, scalar(1.0f)), Error);  // q_t not transposed
  Tensor q_t = Tensor::empty({cols, rows}, DType::e5m2), q_e4m3 = Tensor::empty({rows, cols}, DType::e4m3);
  EXPECT_THROW(ops::fp8_quantize_transpose(q_e4m3, q_t, none, x, scalar(1.0f)), Error);  // dtypes differ
}

// History of 3, max, margin 1: scale = 448 / max(last 3 amaxes) / 2.
TEST(Fp8Recipe, DelayedScalingFollowsTheHistoryWindow) {
  const ops::Fp8Recipe recipe{.amax_history_len = 3, .amax_compute_algo = ops::AmaxComputeAlgo::max, .margin = 1};
  Tensor scale = scalar(1.0f), scale_inv = scalar(1.0f), history = Tensor::zeros({3}, DType::f32);
  const auto step = [&](float amax) {
    history.set_item(0, amax);  // what the casts of the step recorded
    ops::fp8_update_scale(scale, scale_inv, history, DType::e4m3, recipe);
    return scale.item();
  };
  EXPECT_EQ(step(2.0f), 112.0);  // 448 / 2 / 2
  EXPECT_EQ(scale_inv.item(), double(1.0f / 112.0f));
  EXPECT_EQ(history.to_vector(), (std::vector<float>{0, 0, 2}));  // TE's roll by -1, then slot 0 cleared
  EXPECT_EQ(step(8.0f), 28.0);
  EXPECT_EQ(step(1.0f), 28.0);  // 8 is still in the window
  EXPECT_EQ(step(1.0f), 28.0);
  EXPECT_EQ(step(1.0f), 224.0);  // three steps later it has left
  EXPECT_EQ(step(0.0f), 224.0);  // no amax: the scale stays
  EXPECT_EQ(step(0.0f), 224.0);
  EXPECT_EQ(step(0.0f), 224.0);
  EXPECT_EQ(step(std::nanf("")), 224.0);  // nor does a NaN move it
}

TEST(Fp8Recipe, MostRecentAndE5m2) {
  const ops::Fp8Recipe recipe{.amax_history_len = 2};
  Tensor scale = scalar(1.0f), scale_inv = scalar(1.0f), history = Tensor::zeros({2}, DType::f32);
  history.set_item(0, 8.0f);
  ops::fp8_update_scale(scale, scale_inv, history, DType::e5m2, recipe);
  EXPECT_EQ(scale.item(), 7168.0);  // 57344 / 8
  history.set_item(0, 1.0f);
  ops::fp8_update_scale(scale, scale_inv, history, DType::e5m2, recipe);
  EXPECT_EQ(scale.item(), 57344.0);  // the most recent amax, although 8 is in the history
}

// The batched update is the single one per entry: each entry's own dtype, history and scale.
TEST(Fp8Recipe, BatchedUpdateIsTheUpdateOfEachTensor) {
  const ops::Fp8Recipe recipe{.amax_history_len = 2, .amax_compute_algo = ops::AmaxComputeAlgo::max};
  std::vector<Tensor> scales{scalar(1.0f), scalar(5.0f), scalar(7.0f)};
  std::vector<Tensor> scale_invs{scalar(1.0f), scalar(0.2f), scalar(1.0f / 7.0f)};
  std::vector<Tensor> histories{Tensor::from_vector({8.0f, 2.0f}, {2}), Tensor::from_vector({0.0f, 0.0f}, {2}),
                                Tensor::from_vector({1.0f, 4.0f}, {2})};
  const std::vector<DType> dtypes{DType::e5m2, DType::e4m3, DType::e4m3};
  ops::fp8_update_scales(scales, scale_invs, histories, dtypes, recipe);
  EXPECT_EQ(scales[0].item(), 7168.0);  // 57344 / max(8, 2)
  EXPECT_EQ(scales[1].item(), 5.0);     // no amax: kept
  EXPECT_EQ(scales[2].item(), 112.0);   // 448 / max(1, 4)
  EXPECT_EQ(scale_invs[2].item(), double(1.0f / 112.0f));
  EXPECT_EQ(histories[0].to_vector(), (std::vector<float>{0, 8}));
  EXPECT_EQ(histories[2].to_vector(), (std::vector<float>{0, 1}));
  std::vector<DType> too_few{DType::e4m3};
  EXPECT_THROW(ops::fp8_update_scales(scales, scale_invs, histories, too_few, recipe), Error);
}

// C = (a_scale_inv A) (b_scale_inv B)^T on exactly representable values, so the expected C is exact.
TEST(Fp8Ops, MatmulEmulationIsExactOnRepresentableValues) {
  const Tensor a = Tensor::from_vector({1, 2, 3, -1, 0.5f, 4}, {2, 3});
  const Tensor b = Tensor::from_vector({1, 1, 1, 2, -2, 0.25f}, {2, 3});
  Tensor aq = Tensor::empty({2, 3}, DType::e4m3), bq = Tensor::empty({2, 3}, DType::e5m2), none;
  ops::fp8_quantize(aq, none, a, scalar(1.0f));
  ops::fp8_quantize(bq, none, b, scalar(1.0f));
  Tensor c = Tensor::from_vector({1, 1, 1, 1}, {2, 2});
  ops::fp8_matmul(c, aq, scalar(0.5f), bq, scalar(4.0f), {.trans_b = ops::Transpose::yes, .beta = 1.0f});
  // A B^T = [[6, -1.25], [3.5, -2]], times 0.5 * 4, plus the old C
  EXPECT_EQ(c.to_vector(), (std::vector<float>{13, -1.5f, 8, -3}));
  // The same product from A^T stored (trans_a) and B stored untransposed, into bf16.
  Tensor at = Tensor::empty({3, 2}, DType::e4m3), bt = Tensor::empty({3, 2}, DType::e5m2);
  ops::fp8_quantize(at, none, Tensor::from_vector({1, -1, 2, 0.5f, 3, 4}, {3, 2}), scalar(1.0f));
  ops::fp8_quantize(bt, none, Tensor::from_vector({1, 2, 1, -2, 1, 0.25f}, {3, 2}), scalar(1.0f));
  Tensor c16 = Tensor::empty({2, 2}, DType::bf16);
  ops::fp8_matmul(c16, at, scalar(0.5f), bt, scalar(4.0f), {.trans_a = ops::Transpose::yes});
  EXPECT_EQ(c16.to_vector(), (std::vector<float>{12, -2.5f, 7, -4}));
  // Fast accumulation changes only how the tensor cores add; the emulation's sum is exact either way.
  Tensor fast = Tensor::empty({2, 2}, DType::bf16);
  ops::fp8_matmul(fast, at, scalar(0.5f), bt, scalar(4.0f),
                  {.trans_a = ops::Transpose::yes, .fp8_fast_accumulation = true});
  EXPECT_EQ(fast.to_vector(), c16.to_vector());
  // Other GEMMs refuse it.
  EXPECT_TRUE(test::throws_error_naming(
      [&] { ops::matmul(c, a, b, {.trans_b = ops::Transpose::yes, .fp8_fast_accumulation = true}); },
      "fp8_fast_accumulation applies to fp8_matmul only"));
}

// ---- blockwise ----

namespace {

using ops::Fp8BlockShape;

struct BlockCast {
  Tensor q, scale_inv, q_t, scale_inv_t;
};

// x (rows, cols) cast in `blocks`, both layouts, into `dtype`.
BlockCast block_cast(const Tensor& x, Fp8BlockShape blocks, DType dtype = DType::e4m3) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  BlockCast out{
      Tensor::empty({rows, cols}, dtype), Tensor::empty(ops::fp8_block_scale_shape(rows, cols, blocks), DType::f32),
      Tensor::empty({cols, rows}, dtype), Tensor::empty(ops::fp8_block_scale_shape(cols, rows, blocks), DType::f32)};
  ops::fp8_quantize_blockwise(out.q, out.scale_inv, out.q_t, out.scale_inv_t, x, blocks);
  return out;
}

Tensor transposed(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  std::vector<float> t(size_t(rows * cols));
  const std::vector<float> v = x.to_vector();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return Tensor::from_vector(t, {cols, rows}, x.dtype());
}

// The scale a block of amax `amax` gets, worked independently of the op: the largest power of
// two not above fp8_max / amax.
double pow2_scale(double amax, double max_value) { return std::exp2(std::floor(std::log2(max_value / amax))); }

}  // namespace

// Hand-worked 1x128 tiles of a (2, 200) tensor: a full tile and a ragged one (72 elements) per row.
TEST(Fp8Blockwise, TileScalesAreThePowerOfTwoBelowFp8MaxOverAmax) {
  std::vector<float> v(400, 0.0f);
  v[0] = 3.0f;   // row 0, tile 0: amax 3 -> 448 / 3 = 149.3 -> scale 128
  v[1] = -1.0f;  //   -> -128, exact
  v[2] = 0.01f;  //   -> 1.28: e4m3 rounds to 1.25
  // row 0, tile 1 (columns 128..199): all zero -> scale 1, codes 0
  v[200] = 448.0f;        // row 1, tile 0: amax 448 -> scale 1
  v[200 + 130] = 0.001f;  // row 1, tile 1 (ragged): 448 / 0.001 = 448000 -> 2^18 = 262144
  const Tensor x = Tensor::from_vector(v, {2, 200});
  const BlockCast e4m3 = block_cast(x, Fp8BlockShape::tile_1x128);
  // (ceil(200 / 128), round_up(2, 4)) = (2, 4): [tile column, row], padding 0.
  EXPECT_EQ(e4m3.scale_inv.shape(), (Shape{2, 4}));
  EXPECT_EQ(e4m3.scale_inv.to_vector(), (std::vector<float>{0x1p-7f, 1.0f, 0, 0, 1.0f, 0x1p-18f, 0, 0}));
  const std::vector<uint8_t> codes = bits_of(e4m3.q);
  EXPECT_EQ(codes[0], fp8_e4m3::from_float(384.0f));
  EXPECT_EQ(codes[1], fp8_e4m3::from_float(-128.0f));
  EXPECT_EQ(fp8_e4m3::to_float(codes[2]), 1.25f);
  EXPECT_EQ(codes[150], 0x00);
  EXPECT_EQ(codes[200], 0x7E);                        // 448: the block's largest element never saturates past the max
  EXPECT_EQ(fp8_e4m3::to_float(codes[330]), 256.0f);  // 262.144 on the grid of 32 above 256
  // e5m2: 57344 / 3 = 19114.7 -> 2^14.
  const BlockCast e5m2 = block_cast(x, Fp8BlockShape::tile_1x128, DType::e5m2);
  EXPECT_EQ(e5m2.scale_inv.to_vector()[0], 0x1p-14f);
}

// The transposed 1x128 tiles run along x's rows (the token dimension): q_t is exactly the
// row-wise cast of x^T (other tiles than q's, so not q transposed), ragged in both directions.
TEST(Fp8Blockwise, TransposedTilesAreTheCastOfTheTranspose) {
  const Tensor x = wave({130, 3}, 4, 0.2f);
  const BlockCast direct = block_cast(x, Fp8BlockShape::tile_1x128);
  const BlockCast of_transpose = block_cast(transposed(x), Fp8BlockShape::tile_1x128);
  EXPECT_EQ(direct.scale_inv_t.shape(), (Shape{2, 4}));
  EXPECT_EQ(bits_of(direct.q_t), bits_of(of_transpose.q));
  EXPECT_EQ(direct.scale_inv_t.to_vector(), of_transpose.scale_inv.to_vector());
  // Each of x's rows is one ragged tile of 3 elements: its own scale.
  for (int64_t r = 0; r < 130; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < 3; ++c) amax = std::max(amax, std::abs(float(x.item(r * 3 + c))));
    EXPECT_EQ(direct.scale_inv.item(r), 1.0 / pow2_scale(amax, 448.0)) << "row " << r;
  }
}

// 128x128 blocks of a (130, 260) tensor (2 x 3 blocks, ragged at the ends): each block's scale
// from its own amax; q_t is q transposed with the scales transposed (a 2-D block is the same
// block either way).
TEST(Fp8Blockwise, BlockScalesAndTheirTranspose) {
  const int64_t rows = 130, cols = 260;
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * float(i)) * float(1 + (i % 7));
  v[5 * cols + 200] = 1000.0f;  // block (0, 1) holds an outlier
  const Tensor x = Tensor::from_vector(v, {rows, cols});
  const BlockCast cast = block_cast(x, Fp8BlockShape::block_128x128);
  EXPECT_EQ(cast.scale_inv.shape(), (Shape{2, 4}));    // (ceil(130/128), round_up(ceil(260/128), 4))
  EXPECT_EQ(cast.scale_inv_t.shape(), (Shape{3, 4}));  // (ceil(260/128), round_up(ceil(130/128), 4))
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double expected = 0.0;  // padding
      if (j < 3) {
        float amax = 0.0f;
        for (int64_t r = 128 * i; r < std::min(rows, 128 * i + 128); ++r)
          for (int64_t c = 128 * j; c < std::min(cols, 128 * j + 128); ++c)
            amax = std::max(amax, std::abs(v[size_t(r * cols + c)]));
        expected = 1.0 / pow2_scale(amax, 448.0);
        EXPECT_EQ(cast.scale_inv_t.item(j * 4 + i), expected) << i << "," << j;
      }
      EXPECT_EQ(cast.scale_inv.item(i * 4 + j), expected) << i << "," << j;
    }
  EXPECT_EQ(cast.scale_inv.item(1), 1.0 / 0.25);  // 448 / 1000 -> 2^-2
  const std::vector<uint8_t> q = bits_of(cast.q), q_t = bits_of(cast.q_t);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(q_t[size_t(c * rows + r)], q[size_t(r * cols + c)]) << r << "," << c;
}

// The block-scaled GEMM against an f64 GEMM of the dequantised operands (every FP8 value times its
// block's scale_inv, indexed here from the documented layout): the emulation sums in f64 too, so
// only C's final f32 rounding separates them (relative 2^-24; 1e-6 allows it with margin).
TEST(Fp8Blockwise, MatmulIsTheGemmOfTheDequantisedOperands) {
  const int64_t m = 5, n = 140, k = 300;  // ragged K and B-row blocks
  const Tensor a = wave({m, k}, 1, 0.3f), b = wave({n, k}, 2, 1.1f);
  const auto dequantised = [](const BlockCast& cast, Fp8BlockShape blocks) {
    const int64_t rows = cast.q.dim(0), cols = cast.q.dim(1), ld = cast.scale_inv.dim(1);
    const std::vector<uint8_t> codes = bits_of(cast.q);
    std::vector<double> out(codes.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t scale_index = blocks == Fp8BlockShape::tile_1x128 ? (c / 128) * ld + r : (r / 128) * ld + c / 128;
        out[size_t(r * cols + c)] =
            double(fp8_e4m3::to_float(codes[size_t(r * cols + c)])) * cast.scale_inv.item(scale_index);
      }
    return out;
  };
  for (const Fp8BlockShape b_blocks : {Fp8BlockShape::tile_1x128, Fp8BlockShape::block_128x128}) {
    const BlockCast aq = block_cast(a, Fp8BlockShape::tile_1x128), bq = block_cast(b, b_blocks);
    const std::vector<double> A = dequantised(aq, Fp8BlockShape::tile_1x128), B = dequantised(bq, b_blocks);
    Tensor c = Tensor::from_vector(std::vector<float>(size_t(m * n), 0.5f), {m, n});
    ops::fp8_matmul_blockwise(c, aq.q, aq.scale_inv, Fp8BlockShape::tile_1x128, bq.q, bq.scale_inv, b_blocks,
                              {.trans_b = ops::Transpose::yes, .alpha = 2.0f, .beta = 1.0f});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0.5;
        for (int64_t p = 0; p < k; ++p) ref += 2.0 * A[size_t(i * k + p)] * B[size_t(j * k + p)];
        ASSERT_NEAR(c.item(i * n + j), ref, 1e-6 * std::abs(ref) + 1e-30) << i << "," << j;
      }
  }
  // The rules: TN only, not both 128x128, scales of the documented shape.
  const BlockCast wq = block_cast(b, Fp8BlockShape::block_128x128);
  Tensor c = Tensor::empty({n, n}, DType::f32);
  EXPECT_THROW(ops::fp8_matmul_blockwise(c, wq.q, wq.scale_inv, Fp8BlockShape::block_128x128, wq.q, wq.scale_inv,
                                         Fp8BlockShape::block_128x128, {.trans_b = ops::Transpose::yes}),
               Error);
  const BlockCast aq = block_cast(a, Fp8BlockShape::tile_1x128);
  Tensor cm = Tensor::empty({m, n}, DType::f32);
  EXPECT_THROW(ops::fp8_matmul_blockwise(cm, aq.q, aq.scale_inv, Fp8BlockShape::tile_1x128, wq.q, wq.scale_inv,
                                         Fp8BlockShape::block_128x128, {}),
               Error);
  EXPECT_THROW(ops::fp8_matmul_blockwise(cm, aq.q, aq.scale_inv, Fp8BlockShape::tile_1x128, wq.q, aq.scale_inv,
                                         Fp8BlockShape::block_128x128, {.trans_b = ops::Transpose::yes}),
               Error);
  EXPECT_TRUE(test::throws_error_naming(
      [&] {
        ops::fp8_matmul_blockwise(cm, aq.q, aq.scale_inv, Fp8BlockShape::tile_1x128, wq.q, wq.scale_inv,
                                  Fp8BlockShape::block_128x128,
                                  {.trans_b = ops::Transpose::yes, .fp8_fast_accumulation = true});
      },
      "fp8_fast_accumulation applies to per-tensor scaled fp8_matmul only"));
}

// The layer's forward is the FP8 GEMM of its quantised operands; under delayed scaling the first
// step casts with scale 1 and records the amaxes, and the update after it sets 448 / amax.
TEST(Fp8Linear, DelayedScalingForwardAndUpdate) {
  tensor_parallel::Fp8Linear fp8("linear", {.backward_dtype = DType::e5m2}, {});
  const Tensor x = Tensor::from_vector({0.3f, -1.7f, 2.2f, 0.05f, -0.9f, 1.1f}, {2, 3}, DType::bf16);
  const Tensor w = Tensor::from_vector({0.11f, 0.5f, -0.25f, 1.3f, -0.07f, 0.6f}, {2, 3}, DType::bf16);
  Tensor y = Tensor::empty({2, 2}, DType::bf16), no_bias;
  fp8.linear_forward(y, x, w, no_bias);
  // Reference: each element rounded to e4m3 (scale 1), products summed exactly, rounded to bf16.
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < 3; ++k)
        sum += double(float(fp8_e4m3(float(x.item(i * 3 + k))))) * double(float(fp8_e4m3(float(w.item(j * 3 + k)))));
      EXPECT_EQ(y.item(i * 2 + j), double(round_to_bf16(float(sum)))) << i << "," << j;
    }
  EXPECT_EQ(fp8.input().amax_history.item(0), double(round_to_bf16(2.2f)));
  EXPECT_EQ(fp8.weight().amax_history.item(0), double(round_to_bf16(1.3f)));
  fp8.update_scales();
  EXPECT_EQ(fp8.input().scale.item(), double(448.0f / round_to_bf16(2.2f)));
  EXPECT_EQ(fp8.weight().scale.item(), double(448.0f / round_to_bf16(1.3f)));
  EXPECT_FALSE(fp8.grad_output().scale.defined());  // no backward yet: no state
}

// Under the blockwise recipe the layer's three GEMMs take the block casts Transformer Engine's
// Float8BlockScaling takes: y from x's 1x128 tiles and W's 128x128 blocks, dx from dy's tiles and
// W^T's blocks, dW from dy^T's and x^T's tiles along the tokens (e5m2 dy under hybrid), composed
// here from the ops; the layer keeps no scaling state, so a second step with the same tensors
// gives the same bits.
TEST(Fp8Linear, BlockwiseGemmsTakeTheBlockCasts) {
  tensor_parallel::Fp8Linear fp8("linear", {.backward_dtype = DType::e5m2, .scaling = ops::Fp8Scaling::blockwise}, {});
  const int64_t n = 130, in = 140, out = 20;  // ragged tiles along every dimension
  const Tensor x = wave({n, in}, 1, 0.2f), w = wave({out, in}, 2, 0.9f), dy = wave({n, out}, 3, 1.7f);
  StepOutputs got{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                  Tensor::zeros({out, in}, DType::f32)};
  Tensor no_bias;
  fp8.linear_forward(got.y, x, w, no_bias);
  fp8.linear_backward(got.dx, got.dweight, no_bias, dy, x, w, ops::GradWrite::accumulate);

  const BlockCast xq = block_cast(x, Fp8BlockShape::tile_1x128), wq = block_cast(w, Fp8BlockShape::block_128x128);
  const BlockCast dyq = block_cast(dy, Fp8BlockShape::tile_1x128, DType::e5m2);
  const ops::MatmulParams tn{.trans_b = ops::Transpose::yes};
  StepOutputs want{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                   Tensor::zeros({out, in}, DType::f32)};
  ops::fp8_matmul_blockwise(want.y, xq.q, xq.scale_inv, Fp8BlockShape::tile_1x128, wq.q, wq.scale_inv,
                            Fp8BlockShape::block_128x128, tn);
  ops::fp8_matmul_blockwise(want.dx, dyq.q, dyq.scale_inv, Fp8BlockShape::tile_1x128, wq.q_t, wq.scale_inv_t,
                            Fp8BlockShape::block_128x128, tn);
  ops::fp8_matmul_blockwise(want.dweight, dyq.q_t, dyq.scale_inv_t, Fp8BlockShape::tile_1x128, xq.q_t, xq.scale_inv_t,
                            Fp8BlockShape::tile_1x128, tn);
  expect_same_bits(got, want, 0);
  EXPECT_FALSE(fp8.input().scale.defined());  // no state
  fp8.update_scales();                        // nothing to update
  StepOutputs again{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                    Tensor::zeros({out, in}, DType::f32)};
  fp8.linear_forward(again.y, x, w, no_bias);
  fp8.linear_backward(again.dx, again.dweight, no_bias, dy, x, w, ops::GradWrite::accumulate);
  expect_same_bits(again, want, 1);
}

// The recipe state in Transformer Engine's layout (forward tensors input and weight as columns,
// the output gradient apart) taken after 4 steps and loaded into a new layer: the next steps give
// the same bits as the layer that kept it. A layer that starts afresh casts with scale 1 instead.
// The weight's casts are kept through an optimizer step and made again after update_scales(): a
// second micro-batch on the same weight gives the bytes a layer casting afresh gives (same
// scales: the step's), and after the step a changed weight is cast anew (a kept cast would give
// the old weight's products). Per recipe: delayed (history 3, max), tensorwise, blockwise.
TEST(Fp8Linear, WeightCastsAreKeptWithinAStepAndMadeAgainAfter) {
  const ops::Fp8Recipe delayed{
      .backward_dtype = DType::e5m2, .amax_history_len = 3, .amax_compute_algo = ops::AmaxComputeAlgo::max};
  for (const ops::Fp8Recipe& recipe :
       {delayed, ops::Fp8Recipe{.scaling = ops::Fp8Scaling::current},
        ops::Fp8Recipe{.backward_dtype = DType::e5m2, .scaling = ops::Fp8Scaling::blockwise}}) {
    const auto micro_batch = [](tensor_parallel::Fp8Linear& fp8, const Tensor& w, int i, Tensor& dweight) {
      const Tensor x = wave({4, 16}, i, 0.1f), dy = wave({4, 16}, i, 2.9f);
      StepOutputs out{Tensor::empty({4, 16}, DType::bf16), Tensor::empty({4, 16}, DType::bf16), dweight};
      Tensor no_bias;
      fp8.linear_forward(out.y, x, w, no_bias);
      fp8.linear_backward(out.dx, out.dweight, no_bias, dy, x, w, ops::GradWrite::accumulate);
      return out;
    };
    const Tensor w1 = wave({16, 16}, 1, 1.3f), w2 = wave({16, 16}, 5, 0.4f);
    tensor_parallel::Fp8Linear kept("linear", recipe, {}), fresh("linear", recipe, {});
    // Each micro-batch's dW into its own zeroed buffer, so the two layers' are comparable.
    Tensor grad0 = Tensor::zeros({16, 16}, DType::f32), grad1 = Tensor::zeros({16, 16}, DType::f32);
    Tensor fresh_grad = Tensor::zeros({16, 16}, DType::f32);
    micro_batch(kept, w1, 0, grad0);
    expect_same_bits(micro_batch(kept, w1, 1, grad1), micro_batch(fresh, w1, 1, fresh_grad), 1);
    kept.update_scales();  // the step's end; the optimizer would change the weight now
    tensor_parallel::Fp8Linear after("linear", recipe, {});
    after.load_recipe_state(kept.recipe_state(), Device::cpu());  // the scales of the next step
    Tensor next_grad = Tensor::zeros({16, 16}, DType::f32), after_grad = Tensor::zeros({16, 16}, DType::f32);
    expect_same_bits(micro_batch(kept, w2, 2, next_grad), micro_batch(after, w2, 2, after_grad), 2);
  }
}

// The forward's cast of x^T kept for the backward (x_t) gives the gradients of the backward's own
// re-cast of x, also when another micro-batch's forward runs in between (a pipeline schedule's
// order: under current scaling that forward rewrites the operand's scale, which the kept cast must
// not follow). With the cast kept the backward does not read x. Per recipe.
TEST(Fp8Linear, KeptInputCastGivesTheGradientsOfARecast) {
  const ops::Fp8Recipe delayed{
      .backward_dtype = DType::e5m2, .amax_history_len = 3, .amax_compute_algo = ops::AmaxComputeAlgo::max};
  for (const ops::Fp8Recipe& recipe :
       {delayed, ops::Fp8Recipe{.scaling = ops::Fp8Scaling::current},
        ops::Fp8Recipe{.backward_dtype = DType::e5m2, .scaling = ops::Fp8Scaling::blockwise}}) {
    const int64_t n = 130, in = 144, out = 16;  // ragged 1x128 tiles along the tokens
    const Tensor x0 = wave({n, in}, 0, 0.1f), x1 = wave({n, in}, 6, 0.7f), w = wave({out, in}, 1, 1.3f);
    const Tensor dy = wave({n, out}, 2, 2.9f);
    Tensor no_bias;
    const auto outputs = [&] {
      return StepOutputs{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                         Tensor::zeros({out, in}, DType::f32)};
    };
    tensor_parallel::Fp8Linear recast("linear", recipe, {}), kept("linear", recipe, {});
    StepOutputs want = outputs(), got = outputs(), other = outputs();
    recast.linear_forward(want.y, x0, w, no_bias);
    recast.linear_backward(want.dx, want.dweight, no_bias, dy, x0, w, ops::GradWrite::accumulate);
    tensor_parallel::Fp8Linear::Quantized x0_t, x1_t;
    kept.linear_forward(got.y, x0, w, no_bias, &x0_t);
    kept.linear_forward(other.y, x1, w, no_bias, &x1_t);  // the next micro-batch's forward
    ASSERT_EQ(x0_t.codes.shape(), (Shape{in, n}));
    kept.linear_backward(got.dx, got.dweight, no_bias, dy, Tensor(), w, ops::GradWrite::accumulate, &x0_t);
    expect_same_bits(got, want, 0);
  }
}

// A producer's fused cast (Fp8Linear::cast_input / cast_grad_output) records the amaxes the
// layer's own casts record and, given the casts of the tensors, the GEMMs give the bits of the
// layer fed the tensors (delayed recipe, the only one that fuses; the others refuse).
TEST(Fp8Linear, FusedCastsGiveTheLayersOwnCasts) {
  const ops::Fp8Recipe recipe{
      .backward_dtype = DType::e5m2, .amax_history_len = 3, .amax_compute_algo = ops::AmaxComputeAlgo::max};
  const int64_t n = 24, in = 32, out = 16;
  const Tensor w = wave({out, in}, 1, 1.3f);
  tensor_parallel::Fp8Linear plain("linear", recipe, {}), fused("linear", recipe, {});
  for (int step = 0; step < 3; ++step) {  // later steps cast with the updated scales
    const Tensor x = wave({n, in}, step, 0.1f), dy = wave({n, out}, step, 2.9f);
    Tensor no_bias;
    StepOutputs want{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                     Tensor::zeros({out, in}, DType::f32)};
    StepOutputs got{Tensor::empty({n, out}, DType::bf16), Tensor::empty({n, in}, DType::bf16),
                    Tensor::zeros({out, in}, DType::f32)};
    plain.linear_forward(want.y, x, w, no_bias);
    plain.linear_backward(want.dx, want.dweight, no_bias, dy, x, w, ops::GradWrite::accumulate);
    const auto cast_of = [](const Tensor& t) {
      return [&t](Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale) {
        ops::fp8_quantize_transpose(q, q_t, amax, t, scale);
      };
    };
    const tensor_parallel::Fp8Linear::Casts xq = fused.cast_input(n, in, Device::cpu(), cast_of(x));
    fused.linear_forward(got.y, xq, w, no_bias);
    const tensor_parallel::Fp8Linear::Casts dyq = fused.cast_grad_output(n, out, Device::cpu(), cast_of(dy));
    fused.linear_backward(got.dx, got.dweight, dyq, Tensor(), w, ops::GradWrite::accumulate, &xq.transposed);
    expect_same_bits(got, want, step);
    EXPECT_EQ(fused.input().amax_history.to_vector(), plain.input().amax_history.to_vector()) << step;
    EXPECT_EQ(fused.grad_output().amax_history.to_vector(), plain.grad_output().amax_history.to_vector()) << step;
    plain.update_scales();
    fused.update_scales();
    EXPECT_EQ(fused.input().scale.item(), plain.input().scale.item()) << step;
  }
  for (ops::Fp8Scaling scaling : {ops::Fp8Scaling::current, ops::Fp8Scaling::blockwise}) {
    tensor_parallel::Fp8Linear other("linear", {.scaling = scaling}, {});
    EXPECT_FALSE(other.fuses_casts());
    EXPECT_THROW(other.cast_input(n, in, Device::cpu(), [](Tensor&, Tensor&, Tensor&, const Tensor&) {}), Error);
  }
}

TEST(Fp8Linear, RecipeStateResumesBitForBit) {
  const ops::Fp8Recipe recipe{
      .backward_dtype = DType::e5m2, .amax_history_len = 3, .amax_compute_algo = ops::AmaxComputeAlgo::max};
  const std::string name = "decoder.layers.0.mlp.linear_fc1";
  tensor_parallel::Fp8Linear straight(name, recipe, {});
  for (int step = 0; step < 4; ++step) fp8_step(straight, step);
  const tensor_parallel::Fp8Linear::RecipeState state = straight.recipe_state();
  EXPECT_EQ(state.scale_fwd.to_vector(),
            (std::vector<float>{float(straight.input().scale.item()), float(straight.weight().scale.item())}));
  EXPECT_EQ(state.scale_bwd.to_vector(), (std::vector<float>{float(straight.grad_output().scale.item())}));
  ASSERT_EQ(state.amax_history_fwd.shape(), (Shape{3, 2}));
  ASSERT_EQ(state.amax_history_bwd.shape(), (Shape{3, 1}));
  for (int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(state.amax_history_fwd.item(row * 2), straight.input().amax_history.item(row)) << row;
    EXPECT_EQ(state.amax_history_fwd.item(row * 2 + 1), straight.weight().amax_history.item(row)) << row;
    EXPECT_EQ(state.amax_history_bwd.item(row), straight.grad_output().amax_history.item(row)) << row;
  }
  EXPECT_EQ(state.amax_history_fwd.item(0), 0.0);  // the current step's slot, cleared by the update
  EXPECT_GT(state.amax_history_fwd.item(2 * 2), 0.0);

  tensor_parallel::Fp8Linear resumed(name, recipe, {}), fresh(name, recipe, {});
  resumed.load_recipe_state(state, Device::cpu());
  EXPECT_EQ(resumed.input().scale_inv.item(), straight.input().scale_inv.item());
  EXPECT_EQ(resumed.grad_output().scale_inv.item(), straight.grad_output().scale_inv.item());
  for (int step = 4; step < 7; ++step) {
    const StepOutputs kept = fp8_step(straight, step);
    expect_same_bits(kept, fp8_step(resumed, step), step);
    if (step == 4) {
      EXPECT_NE(fp8_step(fresh, step).y.to_vector(), kept.y.to_vector());
    }
  }
  // Before any cast a layer holds its starting state: scale 1, an empty history.
  const tensor_parallel::Fp8Linear unused("linear", recipe, {});
  EXPECT_EQ(unused.recipe_state().scale_fwd.to_vector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(unused.recipe_state().amax_history_bwd.to_vector(), (std::vector<float>{0, 0, 0}));
}

// A history saved with 3 steps loads into 2 and 5 as Transformer Engine's
// adjust_amax_history_length resizes: rows [0, length) kept, zero rows appended; scale_inv = 1 / scale.
TEST(Fp8Linear, LoadedHistoryOfAnotherLengthIsCutOrExtendedAsTransformerEngine) {
  const tensor_parallel::Fp8Linear::RecipeState saved{
      Tensor::from_vector({2, 4}, {2}), Tensor::from_vector({0, 0, 1, 2, 3, 4}, {3, 2}), Tensor::from_vector({8}, {1}),
      Tensor::from_vector({0, 5, 6}, {3, 1})};
  tensor_parallel::Fp8Linear shorter("linear", {.amax_history_len = 2}, {});
  shorter.load_recipe_state(saved, Device::cpu());
  EXPECT_EQ(shorter.input().amax_history.to_vector(), (std::vector<float>{0, 1}));
  EXPECT_EQ(shorter.weight().amax_history.to_vector(), (std::vector<float>{0, 2}));
  EXPECT_EQ(shorter.grad_output().amax_history.to_vector(), (std::vector<float>{0, 5}));
  EXPECT_EQ(shorter.input().scale.item(), 2.0);
  EXPECT_EQ(shorter.input().scale_inv.item(), 0.5);
  EXPECT_EQ(shorter.weight().scale_inv.item(), 0.25);
  EXPECT_EQ(shorter.grad_output().scale_inv.item(), 0.125);
  tensor_parallel::Fp8Linear longer("linear", {.amax_history_len = 5}, {});
  longer.load_recipe_state(saved, Device::cpu());
  EXPECT_EQ(longer.input().amax_history.to_vector(), (std::vector<float>{0, 1, 3, 0, 0}));
  EXPECT_EQ(longer.weight().amax_history.to_vector(), (std::vector<float>{0, 2, 4, 0, 0}));
  EXPECT_EQ(longer.grad_output().amax_history.to_vector(), (std::vector<float>{0, 5, 6, 0, 0}));
  // A state of another shape is refused, naming the layer.
  tensor_parallel::Fp8Linear other("decoder.layers.1.self_attention.linear_proj", {}, {});
  tensor_parallel::Fp8Linear::RecipeState three_scales = saved;
  three_scales.scale_fwd = Tensor::from_vector({1, 2, 3}, {3});
  try {
    other.load_recipe_state(three_scales, Device::cpu());
    ADD_FAILURE() << "a state with 3 forward scales was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.layers.1.self_attention.linear_proj"), std::string::npos) << e.what();
  }
}
