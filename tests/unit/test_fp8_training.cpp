// A tiny LLaMA-style model trains with its linear layers' GEMMs in emulated FP8 (the CPU backend
// quantises exactly as the GPU casts and sums the products in f64): the loss falls as fast as the
// bf16 model's and its curve stays within a stated bound of the bf16 curve, for both recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
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
    opt.step(3e-3, 0.0);
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
  // plus 0.002 (0.06% of the starting loss ln 24): measured (printed below) at most 0.75% for the
  // LLaMA style; the GPT-2 style drifts by up to 0.0014 absolute late in training, where the loss of
  // the memorised pattern is near 0.03 and a relative measure alone would read 2.6%.
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
