// A tiny LLaMA-style model trains with its linear layers' GEMMs in emulated FP8 (the CPU backend
// quantises exactly as the GPU casts and sums the products in f64): the loss falls as fast as the
// bf16 model's and its curve stays within a stated bound of the bf16 curve, for every recipe. And
// the point of the blockwise recipe: one outlier costs the rest of a tensor its precision under a
// per-tensor scale, but only its own tile's under blockwise scales.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/ops/fp8.h"
#include "megatron/optimizer/optimizer.h"
#include "tiny_models.h"

using namespace megatron;

namespace {

struct Batch {
  Tensor tokens, labels, mask;
};

// Token t + 1 follows token t (mod vocab) from a random start: a pattern a model learns quickly.
Batch counting_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  HostRng rng(seed);
  Batch b{Tensor::empty({B, S}, DType::i32), Tensor::empty({B, S}, DType::i32), Tensor::empty({B, S}, DType::f32)};
  for (int64_t r = 0; r < B; ++r) {
    const auto start = int32_t(rng.uniform_int(uint64_t(vocab)));
    for (int64_t s = 0; s < S; ++s) {
      b.tokens.data<int32_t>()[r * S + s] = int32_t((start + s) % vocab);
      b.labels.data<int32_t>()[r * S + s] = int32_t((start + s + 1) % vocab);
      b.mask.data<float>()[r * S + s] = 1.0f;
    }
  }
  return b;
}

std::vector<double> loss_curve(const TransformerConfig& c, int steps) {
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(c, ctx);
  model.parameters().initialize(5);
  AdamWOptimizer opt(model.parameters(), ctx, {.clip_grad = 1.0});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const Batch b = counting_batch(4, c.seq_length, c.vocab_size, uint64_t(step));
    model.parameters().zero_grads();
    const LossSums s = model.forward_backward(b.tokens, b.labels, b.mask, float(1.0 / 64.0),
                                              {.training = true, .seed = 1, .step = uint64_t(step)});
    losses.push_back(s.loss_sum / s.num_tokens);
    model.update_fp8_scales();
    opt.step({3e-3, 0.0});
  }
  return losses;
}

TransformerConfig tiny_bf16(bool gpt2 = false) {
  TransformerConfig c = gpt2 ? megatron::testing::gpt2_style(DType::bf16) : megatron::testing::llama_style(DType::bf16);
  c.num_layers = 3;
  c.hidden_size = 32;
  c.kv_channels = 8;
  c.ffn_hidden_size = 64;
  c.init_method_std = 0.02f;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.seq_length = c.max_position_embeddings = 16;
  return c;
}

// gpt2: the GPT-2 style (biases, the GELU MLP whose fused GEMMs FP8 runs unfused).
void expect_tracks_bf16(const Fp8Config& fp8, bool gpt2 = false) {
  constexpr int kSteps = 120;
  const std::vector<double> bf16 = loss_curve(tiny_bf16(gpt2), kSteps);
  TransformerConfig c = tiny_bf16(gpt2);
  c.fp8 = fp8;
  const std::vector<double> fp8_curve = loss_curve(c, kSteps);
  // FP8 is in use: the first forward already differs from bf16's.
  EXPECT_NE(fp8_curve[0], bf16[0]);
  // Both learn the pattern: the loss falls from ln(24) = 3.18 to well below half of it.
  EXPECT_LT(bf16.back(), 0.5 * bf16.front());
  EXPECT_LT(fp8_curve.back(), 0.5 * fp8_curve.front());
  // The bound: e4m3 keeps 4 significant bits (relative rounding error up to 2^-4 per element,
  // e5m2 2^-3 for gradients), against bf16's 2^-8; over a GEMM's K-term sums the errors largely
  // cancel, and each step's loss is a mean over 64 tokens. |fp8 - bf16| <= 2% of the bf16 loss
  // plus 0.002 (0.06% of the starting loss ln 24): measured (printed below) at most 0.9% for the
  // LLaMA style (0.87% blockwise, 0.75% tensorwise); the GPT-2 style drifts by up to 0.0014 absolute late in training,
  // where the loss of the memorised pattern is near 0.03 and a relative measure alone would read 2.6%.
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    const double gap = std::abs(fp8_curve[size_t(step)] - bf16[size_t(step)]);
    worst = std::max(worst, gap / bf16[size_t(step)]);
    EXPECT_LE(gap, 0.02 * bf16[size_t(step)] + 0.002)
        << "step " << step << ": fp8 " << fp8_curve[size_t(step)] << ", bf16 " << bf16[size_t(step)];
  }
  std::printf("fp8 %s/%s%s: loss %.4f -> %.4f (bf16 %.4f -> %.4f), largest relative gap %.4f\n", fp8.fp8_format.c_str(),
              fp8.fp8_recipe.c_str(), gpt2 ? " gpt2" : "", fp8_curve.front(), fp8_curve.back(), bf16.front(),
              bf16.back(), worst);
}

}  // namespace

TEST(Fp8Training, HybridDelayedScalingTracksBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "hybrid";
  fp8.fp8_amax_history_len = 16;
  fp8.fp8_amax_compute_algo = "max";
  expect_tracks_bf16(fp8);
}

TEST(Fp8Training, E4m3TensorwiseScalingTracksBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "e4m3";
  fp8.fp8_recipe = "tensorwise";
  expect_tracks_bf16(fp8);
}

TEST(Fp8Training, FirstAndLastLayersInBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "hybrid";
  fp8.first_last_layers_bf16 = true;
  expect_tracks_bf16(fp8);
}

TEST(Fp8Training, Gpt2StyleWithBiasesTracksBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "hybrid";
  fp8.fp8_amax_history_len = 4;
  expect_tracks_bf16(fp8, /*gpt2=*/true);
}

// Blockwise here: the tiny model's rows of 32 or 64 features are one (ragged) 1x128 tile each, so
// every token's activations and gradients get their own scale, and each weight is one 128x128
// block, a per-tensor scale rounded down to a power of two (which costs no precision: e4m3's
// relative spacing is the same in every binade above the subnormals). Its casts are therefore at
// least as fine as tensorwise's, and the same bound holds.
TEST(Fp8Training, E4m3BlockwiseScalingTracksBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "e4m3";
  fp8.fp8_recipe = "blockwise";
  expect_tracks_bf16(fp8);
}

TEST(Fp8Training, HybridBlockwiseGpt2StyleTracksBf16) {
  Fp8Config fp8;
  fp8.fp8_format = "hybrid";
  fp8.fp8_recipe = "blockwise";
  expect_tracks_bf16(fp8, /*gpt2=*/true);
}

namespace {

// RMS of (dequantised - x) / rms(x) over the elements outside the first 1x128 tile of row 0.
double relative_rms_error(const std::vector<double>& dequantised, const std::vector<float>& x, int64_t cols) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (int64_t(i) < std::min<int64_t>(cols, ops::kFp8BlockSize)) continue;  // the outlier's tile
    err += (dequantised[i] - x[i]) * (dequantised[i] - x[i]);
    ref += double(x[i]) * double(x[i]);
  }
  return std::sqrt(err / ref);
}

}  // namespace

// An activation-like tensor of magnitudes 0.005 to 0.015 with one outlier of 10^4 (a massive
// activation): the per-tensor scale 448 / 10^4 maps the other values to 0.0002 .. 0.0007, below
// half of e4m3's smallest subnormal (2^-10 = 0.001), so all of them become 0 (relative error 1).
// The blockwise cast scales every other tile to its own amax and keeps e4m3's 4 significant bits:
// steps of 2^-4 to 2^-3 of the value, an RMS error of step / sqrt(12), at most 0.036 of it.
TEST(Fp8Training, BlockwiseCastKeepsThePrecisionAnOutlierTakesFromTensorwise) {
  const int64_t rows = 8, cols = 256;
  std::vector<float> x(size_t(rows * cols));
  HostRng rng(3);
  for (float& v : x) v = float((0.005 + 0.01 * rng.uniform()) * (rng.uniform() < 0.5 ? -1.0 : 1.0));
  x[5] = 1e4f;
  const Tensor t = Tensor::from_vector(x, {rows, cols});

  Tensor none, scale = Tensor::from_vector({448.0f / 1e4f}, {1});  // tensorwise: fp8_max / amax
  Tensor q = Tensor::empty({rows, cols}, DType::e4m3);
  ops::fp8_quantize(q, none, t, scale);
  std::vector<double> per_tensor(x.size());
  const auto* codes = static_cast<const uint8_t*>(q.raw());
  for (size_t i = 0; i < x.size(); ++i) per_tensor[i] = double(fp8_e4m3::to_float(codes[i])) / double(scale.item());

  Tensor qb = Tensor::empty({rows, cols}, DType::e4m3);
  Tensor scale_inv = Tensor::empty(ops::fp8_block_scale_shape(rows, cols, ops::Fp8BlockShape::tile_1x128), DType::f32);
  ops::fp8_quantize_blockwise(qb, scale_inv, none, none, t, ops::Fp8BlockShape::tile_1x128);
  std::vector<double> blockwise(x.size());
  const auto* block_codes = static_cast<const uint8_t*>(qb.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      blockwise[size_t(r * cols + c)] = double(fp8_e4m3::to_float(block_codes[r * cols + c])) *
                                        scale_inv.item((c / ops::kFp8BlockSize) * scale_inv.dim(1) + r);

  const double tensorwise_error = relative_rms_error(per_tensor, x, cols);
  const double blockwise_error = relative_rms_error(blockwise, x, cols);
  std::printf("relative RMS error beside an outlier: tensorwise %.4f, blockwise %.4f\n", tensorwise_error,
              blockwise_error);
  EXPECT_LT(blockwise_error, 0.04);
  EXPECT_GT(tensorwise_error, 0.99);
}
