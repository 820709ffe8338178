// Whole-model checks: gradients of a tiny GPT against finite differences in f64, the initial
// loss of a fresh model, and overfitting one batch.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/optimizer.h"
#include "model_gradient_check.h"
#include "tiny_models.h"

using namespace megatron;
using megatron::testing::gpt2_style;
using megatron::testing::llama_style;

namespace {

TransformerConfig llama_with_hf_features(DType dtype) {
  TransformerConfig c = llama_style(dtype);
  c.window_size_left = 2;
  c.window_size_right = 0;
  c.add_qkv_bias = true;
  c.rotary_base = 500000.0f;
  c.use_rope_scaling = true;
  c.rope_scaling_factor = 32.0f;
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
  test::expect_gradients_match_finite_differences(model, analytic, loss);
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

// The features the Hugging Face families add (Mistral's sliding window, Qwen2's QKV bias,
// Llama-3's RoPE scaling and base) change forward and backward together.
TEST(GPTModel, SlidingWindowQkvBiasAndRopeScalingGradientsMatchFiniteDifferences) {
  check_gradients_by_finite_differences(llama_with_hf_features(DType::f64));
}

// --qk-layernorm (Qwen3, OLMo-2): the query and key heads' norms in both kinds: RMSNorm beside
// GQA and RoPE, LayerNorm (weight and bias) beside learned positions.
TEST(GPTModel, QkLayernormGradientsMatchFiniteDifferences) {
  for (TransformerConfig c : {llama_style(DType::f64), gpt2_style(DType::f64)}) {
    SCOPED_TRACE(c.swiglu ? "llama style" : "gpt2 style");
    c.qk_layernorm = true;
    check_gradients_by_finite_differences(c);
  }
}

// What the q/k norms do, known without them: with eps negligible, a head normalised over its own
// dim forgets its scale, so scaling one query head's or one key head's rows of the QKV weight
// leaves the loss as it was, while scaling a value head's rows moves it; without the norms the
// query scale moves it too (the controls).
TEST(GPTModel, QkLayernormMakesEachQueryAndKeyHeadScaleFree) {
  const auto loss_after_scaling = [](bool qk_layernorm, int64_t first_row, int64_t rows) {
    TransformerConfig c = llama_style(DType::f64);
    c.qk_layernorm = qk_layernorm;
    c.layernorm_epsilon = 1e-30f;
    ParallelContext ctx = ParallelContext::single_process();
    GPTModel model(c, ctx);
    model.parameters().initialize(8);
    for (const auto& p : model.parameters().params()) {
      if (p->spec.name != "decoder.layers.0.self_attention.linear_qkv.weight") continue;
      const int64_t width = c.hidden_size;
      for (int64_t i = first_row * width; i < (first_row + rows) * width; ++i)
        p->data.set_item(i, 3.0 * p->data.item(i));
    }
    const Batch b = random_batch(2, c.seq_length, c.vocab_size, 7);
    const LossSums s = model.evaluate(b.tokens, b.labels, b.mask);
    return s.loss_sum / s.num_tokens;
  };
  // Group 0's rows of the fused weight: its query heads, then its key head, then its value head.
  const TransformerConfig c = llama_style(DType::f64);
  const int64_t d = c.kv_channels, q_heads = c.num_attention_heads / c.num_query_groups;
  const double plain = loss_after_scaling(true, 0, 0);
  EXPECT_NEAR(loss_after_scaling(true, 0, d), plain, 1e-12 * plain) << "query head 0";
  EXPECT_NEAR(loss_after_scaling(true, (q_heads - 1) * d, d), plain, 1e-12 * plain) << "query head " << q_heads - 1;
  EXPECT_NEAR(loss_after_scaling(true, q_heads * d, d), plain, 1e-12 * plain) << "key head 0";
  EXPECT_GT(std::abs(loss_after_scaling(true, (q_heads + 1) * d, d) - plain), 1e-6 * plain) << "value head 0";
  const double without = loss_after_scaling(false, 0, 0);
  EXPECT_GT(std::abs(loss_after_scaling(false, 0, d) - without), 1e-6 * without) << "query head 0, no norms";
  EXPECT_GT(std::abs(without - plain), 1e-6 * plain) << "the norms change the model";
}

// Generation's key/value cache (transformer/kv_cache.h, GPTModel::next_logits): a prompt run into
// the cache, then one token at a time, gives the logits the full forward of the whole sequence
// gives. In f64 the two differ only in the order of a few sums (the cached run's zero query rows
// add nothing): within 1e-12 of logits of size ~1.
void check_cached_logits_equal_full_forward(TransformerConfig c) {
  c.max_position_embeddings = c.seq_length = 12;
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(c, single);
  model.parameters().initialize(11);
  HostRng rng(3);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back(int32_t(rng.uniform_int(uint64_t(c.vocab_size))));
  const auto ids = [&](size_t begin, size_t end) {
    Tensor t = Tensor::empty({1, int64_t(end - begin)}, DType::i32);
    std::copy(tokens.begin() + int64_t(begin), tokens.begin() + int64_t(end), t.data<int32_t>());
    return t;
  };
  KvCache cache(c.seq_length);
  const size_t prompt = 5;
  Tensor cached = model.next_logits(ids(0, prompt), cache);
  EXPECT_EQ(cache.length, int64_t(prompt));
  for (size_t end = prompt; end <= tokens.size(); ++end) {
    if (end > prompt) cached = model.next_logits(ids(end - 1, end), cache);
    const Tensor full = model.last_position_logits(ids(0, end));
    double worst = 0.0;
    for (int64_t i = 0; i < full.numel(); ++i) worst = std::max(worst, std::fabs(cached.item(i) - full.item(i)));
    EXPECT_LE(worst, 1e-12) << "after " << end << " tokens";
  }
  Tensor too_many = Tensor::zeros({1, 1}, DType::i32);
  EXPECT_THROW(model.next_logits(too_many, cache), Error);  // the cache is full
}

TEST(GPTModel, Gpt2StyleCachedGenerationEqualsFullForward) {
  check_cached_logits_equal_full_forward(gpt2_style(DType::f64));
}

TEST(GPTModel, LlamaStyleCachedGenerationWithHfFeaturesEqualsFullForward) {
  check_cached_logits_equal_full_forward(llama_with_hf_features(DType::f64));
}

TEST(GPTModel, QkLayernormCachedGenerationEqualsFullForward) {
  TransformerConfig c = llama_with_hf_features(DType::f64);
  c.qk_layernorm = true;
  check_cached_logits_equal_full_forward(c);
}

// --log-params-norm's norm on one rank: every parameter's weights once, the tied embedding too.
TEST(GPTModel, ParamsNormIsTheNormOfEveryWeight) {
  for (const TransformerConfig& c : {gpt2_style(DType::f32), llama_style(DType::bf16)}) {
    ParallelContext ctx = ParallelContext::single_process();
    GPTModel model(c, ctx);
    model.parameters().initialize(5);
    double squares = 0.0;
    for (const auto& p : model.parameters().params())
      for (int64_t i = 0; i < p->data.numel(); ++i) squares += p->data.item(i) * p->data.item(i);
    const double norm = norm_of_each_parameter_once(model.parameters(), ctx,
                                                    [](const Parameter& p) -> const Tensor& { return p.data; });
    // f32 accumulation of a few thousand squares against f64: 1e-6 relative.
    EXPECT_NEAR(norm, std::sqrt(squares), 1e-6 * std::sqrt(squares)) << (c.swiglu ? "llama" : "gpt2");
  }
}

// --log-num-zeros-in-grad, a count known by hand: in the untied LLaMA-style model the only zero
// gradients are the word-embedding rows of ids no input token has (the output layer's softmax
// reaches every row, padding included), hidden_size each.
TEST(GPTModel, NumZerosInGradAreTheUnusedEmbeddingRows) {
  TransformerConfig c = llama_style(DType::f64);
  c.attention_dropout = c.hidden_dropout = 0.0f;  // a dropped feature could zero a weight's gradient too
  ASSERT_TRUE(c.untie_embeddings_and_output_weights);
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(c, ctx);
  model.parameters().initialize(3);
  AdamWOptimizer opt(model.parameters(), ctx, {.clip_grad = 1.0});
  opt.set_log_num_zeros_in_grad(true);
  Batch b = random_batch(1, 4, c.vocab_size, 9);  // 4 tokens: most of the 24 rows unused
  // Every loss counted: a last token outside the loss would send its embedding row no gradient.
  for (int64_t i = 0; i < b.mask.numel(); ++i) b.mask.data<float>()[i] = 1.0f;
  std::set<int32_t> used(b.tokens.data<int32_t>(), b.tokens.data<int32_t>() + b.tokens.numel());
  model.parameters().zero_grads();
  model.forward_backward(b.tokens, b.labels, b.mask, 0.25f, {.training = true, .seed = 1});
  const OptimizerStepResult step = opt.step({1e-3f, 0.0f});
  ASSERT_TRUE(step.num_zeros_in_grad.has_value());
  EXPECT_EQ(*step.num_zeros_in_grad, double((c.padded_vocab_size - int64_t(used.size())) * c.hidden_size));
  opt.set_log_num_zeros_in_grad(false);
  EXPECT_FALSE(opt.step({1e-3f, 0.0f}).num_zeros_in_grad.has_value());
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

// --init-method-xavier-uniform: every weight the normal init would draw lies in Xavier's bound of
// its global matrix, a = sqrt(6 / (fan_in + fan_out)) (an expert's own (out, in) matrix), and fills
// it as a uniform does where it has n >= 384 elements: the largest draw within 10% of a (each draw
// misses that band with probability 0.9, all of them with 0.9^384 < 1e-17) and the mean square
// a^2 / 3 within 15% (the estimate's relative spread is sqrt(0.8 / n) <= 4.6%: over 3 spreads).
// Norm weights and biases keep their ones and zeros; the draws differ from the normal init's.
TEST(GPTModel, XavierUniformInitDrawsEachMatrixWithinItsBound) {
  TransformerConfig gpt2 = gpt2_style(DType::f32);
  gpt2.hidden_size = 32;
  gpt2.kv_channels = 8;
  gpt2.ffn_hidden_size = 64;
  gpt2.max_position_embeddings = gpt2.seq_length = 16;
  TransformerConfig moe = gpt2;
  moe.normalization = Normalization::RMSNorm;
  moe.swiglu = true;
  moe.position_embedding_type = PositionEmbeddingType::rope;
  moe.add_bias_linear = false;
  moe.moe.num_moe_experts = 4;
  moe.moe.moe_ffn_hidden_size = 48;
  for (const TransformerConfig& c : {gpt2, moe}) {
    SCOPED_TRACE(c.swiglu ? "llama style with experts" : "gpt2 style");
    ParallelContext ctx = ParallelContext::single_process();
    GPTModel xavier(c, ctx), normal(c, ctx);
    xavier.parameters().initialize(5, true);
    normal.parameters().initialize(5);
    int64_t drawn = 0;
    for (size_t k = 0; k < normal.parameters().params().size(); ++k) {
      const Parameter& p = *xavier.parameters().params()[k];
      const std::vector<float> got = p.data.to_vector();
      const std::vector<float> plain = normal.parameters().params()[k]->data.to_vector();
      if (p.spec.init != InitMethod::normal) {
        EXPECT_EQ(got, plain) << p.spec.name;
        continue;
      }
      const Shape& shape = p.spec.global_shape;
      const double a = std::sqrt(6.0 / double(shape[shape.size() - 2] + shape.back()));
      double largest = 0.0, squares = 0.0;
      for (float v : got) {
        largest = std::max(largest, double(std::abs(v)));
        squares += double(v) * v;
      }
      EXPECT_LE(largest, a * (1.0 + 1e-6)) << p.spec.name;  // the bound as a float
      EXPECT_NE(got, plain) << p.spec.name;
      const double n = double(got.size());
      if (n < 384) continue;
      ++drawn;
      EXPECT_GE(largest, 0.9 * a) << p.spec.name;
      EXPECT_NEAR(squares / n, a * a / 3.0, 0.15 * a * a / 3.0) << p.spec.name;
    }
    EXPECT_GE(drawn, 8);
  }
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
      opt.step({1e-2, 0.0});
    }
    EXPECT_LT(loss, 0.1) << (c.swiglu ? "llama" : "gpt2") << " style";
  }
}

// --decoupled-lr: after one step from the same gradients, the word embedding and the output
// layer (one tied weight in the gpt2-style model, two in the llama-style one) equal a step of
// every parameter at the decoupled rate, every other parameter (the position embedding included,
// as in Megatron) a step at the plain rate.
TEST(GPTModel, DecoupledLrStepsTheEmbeddingAndOutputLayerAtItsRate) {
  for (const TransformerConfig& c : {gpt2_style(DType::f32), llama_style(DType::f32)}) {
    SCOPED_TRACE(c.swiglu ? "llama style" : "gpt2 style");
    ParallelContext ctx = ParallelContext::single_process();
    const Batch b = random_batch(2, c.seq_length, c.vocab_size, 3);
    const auto one_step = [&](const StepRates& rates) {
      auto model = std::make_unique<GPTModel>(c, ctx);
      model->parameters().initialize(1);
      AdamWOptimizer opt(model->parameters(), ctx, {.clip_grad = 1.0});
      model->parameters().zero_grads();
      model->forward_backward(b.tokens, b.labels, b.mask, 0.1f, {.training = true, .seed = 1});
      opt.step(rates);
      return model;
    };
    const auto decoupled = one_step({1e-2f, 0.1f, 3e-3f});
    const auto at_lr = one_step({1e-2f, 0.1f});
    const auto at_decoupled = one_step({3e-3f, 0.1f});
    std::vector<std::string> marked;
    for (size_t k = 0; k < decoupled->parameters().params().size(); ++k) {
      const Parameter& p = *decoupled->parameters().params()[k];
      if (p.spec.embedding_or_output) marked.push_back(p.spec.name);
      GPTModel& want = p.spec.embedding_or_output ? *at_decoupled : *at_lr;
      EXPECT_EQ(p.data.to_vector(), want.parameters().params()[k]->data.to_vector()) << p.spec.name;
    }
    EXPECT_EQ(marked, c.untie_embeddings_and_output_weights
                          ? (std::vector<std::string>{"embedding.word_embeddings.weight", "output_layer.weight"})
                          : (std::vector<std::string>{"embedding.word_embeddings.weight"}));
    EXPECT_NE(at_lr->parameters().param_buffer().to_vector(), at_decoupled->parameters().param_buffer().to_vector());
  }
}

// --apply-wd-to-qk-layernorm: from the same gradients, one step with the query and key layernorms
// decayed differs from one without exactly there, by AdamW's decoupled decay lr * wd * w of the
// weights before the step (ones at init, so 1e-3); every other parameter, the other norms
// included, steps identically. Both norm kinds: RMSNorm (weights) and LayerNorm (weights, biases).
TEST(GPTModel, ApplyWdToQkLayernormDecaysOnlyTheQueryAndKeyNorms) {
  for (TransformerConfig c : {llama_style(DType::f32), gpt2_style(DType::f32)}) {
    SCOPED_TRACE(c.swiglu ? "llama style" : "gpt2 style");
    c.qk_layernorm = true;
    ParallelContext ctx = ParallelContext::single_process();
    const Batch b = random_batch(2, c.seq_length, c.vocab_size, 3);
    const StepRates rates{1e-2f, 0.1f};
    const auto one_step = [&](bool decay_qk_layernorm) {
      auto model = std::make_unique<GPTModel>(c, ctx);
      model->parameters().initialize(1);
      AdamWOptimizer opt(model->parameters(), ctx, {.clip_grad = 1.0, .decay_qk_layernorm = decay_qk_layernorm});
      model->parameters().zero_grads();
      model->forward_backward(b.tokens, b.labels, b.mask, 0.1f, {.training = true, .seed = 1});
      opt.step(rates);
      return model;
    };
    const auto decayed = one_step(true), plain = one_step(false);
    std::set<std::string> differing;
    for (size_t k = 0; k < plain->parameters().params().size(); ++k) {
      const Parameter& p = *plain->parameters().params()[k];
      const std::vector<float> got = decayed->parameters().params()[k]->data.to_vector();
      const std::vector<float> want = p.data.to_vector();
      if (got != want) differing.insert(p.spec.name);
      if (!p.spec.name.ends_with("q_layernorm.weight") && !p.spec.name.ends_with("k_layernorm.weight")) continue;
      // f32 steps of size ~1e-2 from 1: each value is off by at most an ulp of 1 (1.2e-7) on either side.
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(double(want[i]) - double(got[i]), double(rates.lr) * rates.weight_decay * 1.0, 3e-7) << p.spec.name;
    }
    EXPECT_EQ(differing, (std::set<std::string>{"decoder.layers.0.self_attention.k_layernorm.weight",
                                                "decoder.layers.0.self_attention.q_layernorm.weight",
                                                "decoder.layers.1.self_attention.k_layernorm.weight",
                                                "decoder.layers.1.self_attention.q_layernorm.weight"}));
    // The biases of LayerNorm q/k norms are decayed too (Megatron's name match), though at their
    // initial zeros the step cannot show it; the other norms' and the linear layers' biases are not.
    for (const auto& p : plain->parameters().params()) {
      const bool qk = p->spec.name.find("q_layernorm.") != std::string::npos ||
                      p->spec.name.find("k_layernorm.") != std::string::npos;
      EXPECT_EQ(applies_weight_decay(p->spec, {.decay_qk_layernorm = true}), p->spec.weight_decay || qk)
          << p->spec.name;
      EXPECT_EQ(applies_weight_decay(p->spec, {}), p->spec.weight_decay) << p->spec.name;
    }
  }
}

namespace {

// Document masking (--reset-attention-mask, with --reset-position-ids): a row holding documents of
// lengths 2 and 4 gives each token the loss it has when its document is run alone. RoPE rotates
// by the position in the row, but scores depend only on relative positions inside a document.
void check_documents_attend_only_to_themselves(TransformerConfig config) {
  config.attention_dropout = config.hidden_dropout = 0.0f;
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(config, ctx);
  model.parameters().initialize(21);
  const int64_t S = config.seq_length, first = 2;  // documents [0, 2) and [2, 6)
  const Batch row = random_batch(1, S, config.vocab_size, 17);
  Tensor positions = Tensor::empty({1, S}, DType::i32), segments = Tensor::empty({1, S}, DType::i32);
  for (int64_t t = 0; t < S; ++t) {
    positions.data<int32_t>()[t] = int32_t(t < first ? t : t - first);
    segments.data<int32_t>()[t] = t < first ? 0 : 1;
  }
  const auto slice = [](const Tensor& t, int64_t begin, int64_t end) {
    return t.view({-1}).slice(begin, end).clone().view({1, -1});
  };
  const LossSums joint = model.evaluate(row.tokens, row.labels, row.mask, positions, segments);
  double separate = 0.0;
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, first}, {first, S}})
    separate +=
        model.evaluate(slice(row.tokens, begin, end), slice(row.labels, begin, end), slice(row.mask, begin, end))
            .loss_sum;
  // f64 arithmetic, so only summation order differs (1e-12 relative) — except RoPE, whose angles
  // are f32 as in Megatron: position p's angle is off by up to p * 2^-24 rad, and the second
  // document's tokens sit at other positions jointly than alone (1e-7 relative covers p <= 6).
  const bool rope = config.position_embedding_type == PositionEmbeddingType::rope;
  EXPECT_NEAR(joint.loss_sum, separate, (rope ? 1e-7 : 1e-12) * std::abs(separate));
  // Without the mask the second document sees the first, so the check can fail.
  const LossSums unmasked = model.evaluate(row.tokens, row.labels, row.mask, positions);
  EXPECT_GT(std::abs(unmasked.loss_sum - separate), 1e-6);
}

}  // namespace

TEST(GPTModel, Gpt2StyleDocumentMaskingEqualsSeparateDocuments) {
  check_documents_attend_only_to_themselves(gpt2_style(DType::f64));
}

TEST(GPTModel, LlamaStyleDocumentMaskingEqualsSeparateDocuments) {
  check_documents_attend_only_to_themselves(llama_style(DType::f64));
}

TEST(GPTModel, DocumentMaskingGradientsMatchFiniteDifferences) {
  TransformerConfig config = llama_style(DType::f64);
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(config, ctx);
  model.parameters().initialize(42);
  const Batch batch = random_batch(2, config.seq_length, config.vocab_size, 7);
  const Tensor segments = Tensor::from_vector({0, 0, 0, 1, 1, 2, 0, 1, 1, 1, 1, 1}, {2, config.seq_length}, DType::i32);
  const ForwardContext fwd{.training = true, .seed = 99, .step = 3};
  model.parameters().zero_grads();
  model.forward_backward(batch.tokens, batch.labels, batch.mask, 1.0f, fwd, Tensor(), segments);
  const Tensor analytic = model.parameters().grad_buffer().clone();
  const auto loss = [&] {
    return model.forward_backward(batch.tokens, batch.labels, batch.mask, 1.0f, fwd, Tensor(), segments).loss_sum;
  };
  test::expect_gradients_match_finite_differences(model, analytic, loss);
}
