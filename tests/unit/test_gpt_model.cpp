// Whole-model checks: gradients of a tiny GPT against finite differences in f64, the initial
// loss of a fresh model, and overfitting one batch.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/optimizer.h"

using namespace megatron;

namespace {

TransformerConfig gpt2_style(DType dtype) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 4;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.vocab_size = c.padded_vocab_size = 24;
  c.max_position_embeddings = c.seq_length = 6;
  c.init_method_std = 0.3f;  // large enough that every path carries a visible gradient
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.2f;
  c.params_dtype = dtype;
  return c;
}

TransformerConfig llama_style(DType dtype) {
  TransformerConfig c = gpt2_style(dtype);
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.position_embedding_type = PositionEmbeddingType::rope;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

struct Batch {
  Tensor tokens, labels, mask;
};

Batch random_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  HostRng rng(seed);
  Batch b{Tensor::empty({B, S}, DType::i32), Tensor::empty({B, S}, DType::i32), Tensor::empty({B, S}, DType::f32)};
  for (int64_t i = 0; i < B * S; ++i) {
    b.tokens.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(vocab)));
    b.labels.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(vocab)));
    b.mask.data<float>()[i] = (i % 5 == 3) ? 0.0f : 1.0f;  // some masked tokens
  }
  return b;
}

void check_gradients_by_finite_differences(const TransformerConfig& config) {
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(config, ctx);
  model.parameters().initialize(42);
  const Batch batch = random_batch(2, config.seq_length, config.vocab_size, 7);
  const ForwardContext fwd{.training = true, .seed = 99, .step = 3};  // dropout on, masks fixed
  const float scale = 0.125f;

  model.parameters().zero_grads();
  model.forward_backward(batch.tokens, batch.labels, batch.mask, scale, fwd);
  const Tensor analytic = model.parameters().grad_buffer().clone();

  auto loss = [&] {
    return scale * model.forward_backward(batch.tokens, batch.labels, batch.mask, scale, fwd).loss_sum;
  };
  // Central differences in f64: truncation O(h^2 * f''') ~ 1e-12 and roundoff ~ eps * |L| / h
  // ~ 1e-10, against gradients of order 1e-3..1: 1e-6 relative (plus 1e-9 absolute) leaves margin.
  const double h = 1e-5;
  int checked = 0;
  HostRng pick(5);
  for (const auto& p : model.parameters().params()) {
    for (int sample = 0; sample < 3; ++sample) {
      const int64_t i = int64_t(pick.uniform_int(uint64_t(p->data.numel())));
      const double original = p->data.item(i);
      p->data.set_item(i, original + h);
      const double up = loss();
      p->data.set_item(i, original - h);
      const double down = loss();
      p->data.set_item(i, original);
      const double numeric = (up - down) / (2 * h);
      const double exact = p->view_of(analytic).item(i);
      EXPECT_NEAR(exact, numeric, 1e-9 + 1e-6 * std::abs(numeric)) << p->spec.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

double initial_loss(int64_t vocab, int64_t divisible_by) {
  TransformerConfig c = gpt2_style(DType::f32);
  c.hidden_size = 64;
  c.kv_channels = 16;
  c.ffn_hidden_size = 256;
  c.seq_length = c.max_position_embeddings = 32;
  c.init_method_std = 0.02f;
  c.vocab_size = vocab;
  c.padded_vocab_size = (vocab + divisible_by - 1) / divisible_by * divisible_by;
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(c, ctx);
  model.parameters().initialize(1234);
  const Batch b = random_batch(4, c.seq_length, vocab, 11);
  const LossSums s = model.evaluate(b.tokens, b.labels, b.mask);
  return s.loss_sum / s.num_tokens;
}

}  // namespace

TEST(GPTModel, Gpt2StyleGradientsMatchFiniteDifferences) {
  check_gradients_by_finite_differences(gpt2_style(DType::f64));
}

TEST(GPTModel, LlamaStyleGradientsMatchFiniteDifferences) {
  check_gradients_by_finite_differences(llama_style(DType::f64));
}

TEST(GPTModel, InitialLossIsLogVocab) {
  // With std 0.02 weights the logits are ~0, so the softmax is nearly uniform over the padded
  // vocabulary (padded rows take part in the softmax, as in Megatron).
  EXPECT_NEAR(initial_loss(512, 128), std::log(512.0), 0.1);
  EXPECT_NEAR(initial_loss(1000, 1), std::log(1000.0), 0.1);
}

TEST(GPTModel, SameSeedSameModelAnyRegistrationOrder) {
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel a(llama_style(DType::f32), ctx), b(llama_style(DType::f32), ctx);
  a.parameters().initialize(3);
  b.parameters().initialize(3);
  EXPECT_EQ(a.parameters().param_buffer().to_vector(), b.parameters().param_buffer().to_vector());
  b.parameters().initialize(4);
  EXPECT_NE(a.parameters().param_buffer().to_vector(), b.parameters().param_buffer().to_vector());
}

TEST(GPTModel, OverfitsOneBatch) {
  for (const TransformerConfig& base : {gpt2_style(DType::f32), llama_style(DType::f32)}) {
    TransformerConfig c = base;
    c.hidden_size = 32;
    c.kv_channels = 8;
    c.init_method_std = 0.02f;
    c.attention_dropout = c.hidden_dropout = 0.0f;
    c.seq_length = c.max_position_embeddings = 16;
    ParallelContext ctx = ParallelContext::single_process();
    GPTModel model(c, ctx);
    model.parameters().initialize(1);
    AdamWOptimizer opt(model.parameters(), ctx, {.clip_grad = 1.0});
    const Batch b = random_batch(2, c.seq_length, c.vocab_size, 3);
    double loss = 0;
    for (int step = 0; step < 300; ++step) {
      model.parameters().zero_grads();
      const LossSums s = model.forward_backward(b.tokens, b.labels, b.mask, float(1.0 / 26.0),
                                                {.training = true, .seed = 1, .step = uint64_t(step)});
      loss = s.loss_sum / s.num_tokens;
      opt.step(1e-2, 0.0);
    }
    EXPECT_LT(loss, 0.1) << (c.swiglu ? "llama" : "gpt2") << " style";
  }
}
