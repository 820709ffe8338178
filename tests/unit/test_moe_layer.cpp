// The MoE layer inside a tiny GPT (one MoE layer, one dense): every parameter's gradient against
// central finite differences in f64, for softmax routing with the load-balancing and z losses, a
// shared expert (gated or not) and capacity drops with padding, and for DeepSeek-style sigmoid routing with
// group limits, the expert bias and the per-sequence loss; experts as per-expert GEMMs and as
// the grouped GEMM. The routers' losses enter the
// objective with ForwardContext::aux_loss_grad_scale, as their gradients do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "model_gradient_check.h"
#include "tiny_models.h"

using namespace megatron;

namespace {

TransformerConfig moe_model() {
  TransformerConfig c = megatron::testing::llama_style(DType::f64);
  c.group_query_attention = false;
  c.num_query_groups = 4;
  c.attention_dropout = 0.0f;
  c.hidden_dropout = 0.1f;
  c.moe.num_moe_experts = 4;
  c.moe.moe_layer_freq = "[0,1]";
  c.moe.moe_ffn_hidden_size = 8;
  return c;
}

void check_gradients_by_finite_differences(const TransformerConfig& config) {
  ASSERT_TRUE(validate(config).empty()) << validate(config).front();
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(config, ctx);
  model.parameters().initialize(42);
  HostRng rng(7);
  const int64_t B = 2, S = config.seq_length;
  Tensor tokens = Tensor::empty({B, S}, DType::i32), labels = Tensor::empty({B, S}, DType::i32);
  Tensor mask = Tensor::empty({B, S}, DType::f32);
  for (int64_t i = 0; i < B * S; ++i) {
    tokens.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(config.vocab_size)));
    labels.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(config.vocab_size)));
    mask.data<float>()[i] = (i % 5 == 3) ? 0.0f : 1.0f;
  }
  const float scale = 0.125f;
  const ForwardContext fwd{.training = true, .seed = 99, .step = 3, .aux_loss_grad_scale = 0.5f};

  model.parameters().zero_grads();
  model.forward_backward(tokens, labels, mask, scale, fwd);
  ASSERT_EQ(model.moe_stats().layers, 1);
  const Tensor analytic = model.parameters().grad_buffer().clone();
  auto loss = [&] {
    const LossSums s = model.forward_backward(tokens, labels, mask, scale, fwd);
    return scale * s.loss_sum + fwd.aux_loss_grad_scale * model.moe_stats().values().weighted_losses;
  };
  // A step of 1e-5 changes no top-k choice or capacity decision of these inputs.
  test::expect_gradients_match_finite_differences(model, analytic, loss);
}

}  // namespace

TEST(MoELayer, SoftmaxRoutingWithLossesSharedExpertAndCapacityMatchesFiniteDifferences) {
  TransformerConfig c = moe_model();
  c.moe.moe_aux_loss_coeff = 0.1;
  c.moe.moe_z_loss_coeff = 0.01;
  c.moe.moe_shared_expert_intermediate_size = 12;
  c.moe.moe_expert_capacity_factor = 1.0;
  c.moe.moe_pad_expert_input_to_capacity = true;
  check_gradients_by_finite_differences(c);
}

// Megatron's shared-expert gate (Qwen2-MoE's shared_expert_gate): the shared expert's output
// scaled per token by sigmoid(x . gate_weight), whose gradient the check covers with the rest.
TEST(MoELayer, GatedSharedExpertMatchesFiniteDifferences) {
  TransformerConfig c = moe_model();
  c.moe.moe_router_pre_softmax = true;
  c.moe.moe_shared_expert_intermediate_size = 12;
  c.moe.moe_shared_expert_gate = true;
  check_gradients_by_finite_differences(c);
}

TEST(MoELayer, DroplessPreSoftmaxGroupedGemmMatchesFiniteDifferences) {
  TransformerConfig c = moe_model();
  c.moe.moe_router_pre_softmax = true;
  c.moe.moe_router_topk = 3;
  c.moe.moe_router_topk_scaling_factor = 1.5;
  c.moe.moe_aux_loss_coeff = 0.2;
  c.moe.moe_grouped_gemm = true;
  c.swiglu = false;  // GELU experts
  check_gradients_by_finite_differences(c);
}

TEST(MoELayer, SigmoidGroupLimitedWithExpertBiasMatchesFiniteDifferences) {
  TransformerConfig c = moe_model();
  c.moe.moe_router_score_function = RouterScoreFunction::sigmoid;
  c.moe.moe_router_enable_expert_bias = true;
  c.moe.moe_router_num_groups = 2;
  c.moe.moe_router_group_topk = 1;
  c.moe.moe_router_load_balancing_type = LoadBalancingType::seq_aux_loss;
  c.moe.moe_aux_loss_coeff = 0.3;
  check_gradients_by_finite_differences(c);
}

TEST(MoELayer, ExpertBiasUpdateFollowsTheTokenCounts) {
  TransformerConfig c = moe_model();
  c.params_dtype = DType::f32;
  c.moe.moe_router_score_function = RouterScoreFunction::sigmoid;
  c.moe.moe_router_enable_expert_bias = true;
  c.moe.moe_router_bias_update_rate = 0.25;
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(c, ctx);
  model.parameters().initialize(3);
  Tensor tokens = Tensor::zeros({2, c.seq_length}, DType::i32), mask = Tensor::empty({2, c.seq_length}, DType::f32);
  mask.fill(1.0);
  // Identical tokens all choose the same 2 of 4 experts: over two micro-batches those see 24
  // tokens each and the others none (mean 12), so the chosen ones' bias falls by the rate and the
  // others' rises by it.
  model.forward_backward(tokens, tokens, mask, 1.0f, {.training = true});
  model.forward_backward(tokens, tokens, mask, 1.0f, {.training = true});
  model.evaluate(tokens, tokens, mask);  // evaluation does not count
  model.update_expert_bias();
  const std::vector<moe::MoELayer*> layers = model.moe_layers();
  ASSERT_EQ(layers.size(), 1u);
  std::vector<double> bias = layers[0]->router().expert_bias();
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<double>{-0.25, -0.25, 0.25, 0.25}));
  // The update cleared the counter: all-zero counts are balanced and move nothing.
  model.update_expert_bias();
  std::vector<double> again = layers[0]->router().expert_bias();
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, bias);
}

// --moe-router-force-load-balancing (Megatron's RandomSTE): identical tokens, which otherwise all
// choose the same 2 of 4 experts, are spread over all four by random N(0,1) logits, drawn anew
// for each micro-batch and again the same for the same one; the routing's gradient still reaches
// the router's weight (straight through).
TEST(MoELayer, ForceLoadBalancingRoutesOnRandomLogits) {
  TransformerConfig c = moe_model();
  c.params_dtype = DType::f32;
  c.hidden_dropout = 0.0f;
  c.seq_length = 512;
  c.max_position_embeddings = 512;
  ParallelContext ctx = ParallelContext::single_process();
  const int64_t B = 2, T = B * c.seq_length, k = c.moe.moe_router_topk;
  Tensor tokens = Tensor::zeros({B, c.seq_length}, DType::i32), mask = Tensor::empty({B, c.seq_length}, DType::f32);
  mask.fill(1.0);
  double loss = 0.0;  // of the last loads() call
  const auto loads = [&](GPTModel& model, uint64_t step) {
    model.parameters().zero_grads();
    loss = model.forward_backward(tokens, tokens, mask, 1.0f, {.training = true, .seed = 5, .step = step}).loss_sum;
    const moe::MoEStats::Values v = model.moe_stats().values();
    return std::pair{v.min_tokens_per_expert, v.max_tokens_per_expert};
  };
  {
    GPTModel model(c, ctx);
    model.parameters().initialize(3);
    EXPECT_EQ(loads(model, 0), std::pair(int64_t(0), T)) << "identical tokens, the router's own logits";
  }
  c.moe.moe_router_force_load_balancing = true;
  ASSERT_TRUE(validate(c).empty()) << validate(c).front();
  GPTModel model(c, ctx);
  model.parameters().initialize(3);
  // T k / E = 512 tokens per expert on average; a binomial count's standard deviation is below 20,
  // so 64 either way is more than 3 of them.
  const auto [lo, hi] = loads(model, 0);
  const int64_t mean = T * k / c.moe.num_moe_experts;
  EXPECT_GE(lo, mean - 64);
  EXPECT_LE(hi, mean + 64);
  const Parameter* router = nullptr;
  for (const auto& p : model.parameters().params())
    if (p->spec.name.find("router.weight") != std::string::npos) router = p.get();
  ASSERT_NE(router, nullptr);
  const std::vector<float> grad = router->main_grad.to_vector();
  EXPECT_TRUE(std::any_of(grad.begin(), grad.end(), [](float g) { return g != 0.0f; }))
      << "no gradient reached the router's weight";
  const double first = loss;
  EXPECT_EQ(loads(model, 0), std::pair(lo, hi));
  EXPECT_EQ(loss, first) << "the same micro-batch draws the same logits";
  loads(model, 1);
  EXPECT_NE(loss, first) << "the next micro-batch draws new ones";
}

TEST(MoELayer, ParameterCountMatchesTheRegistry) {
  // num_parameters (the formula the log and `plan` use) against what the model registers.
  TransformerConfig c = moe_model();
  c.moe.moe_shared_expert_intermediate_size = 12;
  for (const bool gate : {false, true}) {
    c.moe.moe_shared_expert_gate = gate;
    ParallelContext ctx = ParallelContext::single_process();
    GPTModel model(c, ctx);
    int64_t registered = 0;
    for (const auto& p : model.parameters().params()) registered += shape_numel(p->spec.global_shape);
    EXPECT_EQ(num_parameters(c), registered) << (gate ? "with" : "without") << " the shared-expert gate";
  }
}
