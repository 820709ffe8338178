// Activation recomputation (--recompute-*): Megatron's segments worked by hand, the settings'
// errors, gradients bit-identical to a run that keeps everything (the recomputed forward runs the
// same kernels on the same inputs, with counter-based dropout masks), and the activation memory a
// forward keeps dropping by exactly the tensors each setting no longer saves.
#include <gtest/gtest.h>

#include <cstring>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "tiny_models.h"

using namespace megatron;

namespace {

RecomputeConfig full(const std::string& method, int64_t n) {
  RecomputeConfig r;
  r.recompute_granularity = "full";
  r.recompute_method = method;
  r.recompute_num_layers = n;
  return r;
}

RecomputeConfig selective(std::vector<std::string> modules) {
  RecomputeConfig r;
  r.recompute_granularity = "selective";
  r.recompute_modules = std::move(modules);
  return r;
}

TEST(RecomputeSegments, MegatronsUniformAndBlockMethods) {
  using S = LayerSegment;
  EXPECT_EQ(recompute_segments({}, 5), (std::vector<S>{{0, 5, false}}));
  EXPECT_EQ(recompute_segments(selective({"mlp"}), 5), (std::vector<S>{{0, 5, false}}));
  // uniform: every layer, in groups of N (the last group takes what is left)
  EXPECT_EQ(recompute_segments(full("uniform", 2), 5), (std::vector<S>{{0, 2, true}, {2, 4, true}, {4, 5, true}}));
  EXPECT_EQ(recompute_segments(full("uniform", 5), 5), (std::vector<S>{{0, 5, true}}));
  // block: the first N layers, each on its own; the rest keep their activations
  EXPECT_EQ(recompute_segments(full("block", 2), 5), (std::vector<S>{{0, 1, true}, {1, 2, true}, {2, 5, false}}));
  // a pipeline chunk with fewer layers than N recomputes all of them
  EXPECT_EQ(recompute_segments(full("block", 3), 2), (std::vector<S>{{0, 1, true}, {1, 2, true}}));
}

bool mentions(const std::vector<std::string>& errors, const std::string& text) {
  for (const std::string& e : errors)
    if (e.find(text) != std::string::npos) return true;
  return false;
}

TEST(RecomputeConfig, EveryBrokenRuleIsNamed) {
  EXPECT_TRUE(validate_recompute(full("uniform", 2), 4).empty());
  EXPECT_TRUE(validate_recompute(selective({"core_attn", "mlp"}), 4).empty());
  RecomputeConfig shorthand;
  shorthand.recompute_activations = true;
  EXPECT_TRUE(validate_recompute(shorthand, 4).empty());
  EXPECT_TRUE(shorthand.recomputes("core_attn"));  // Megatron's default module
  EXPECT_FALSE(shorthand.recomputes("mlp"));

  RecomputeConfig no_method = full("", 2);
  EXPECT_TRUE(mentions(validate_recompute(no_method, 4), "needs --recompute-method"));
  RecomputeConfig no_layers = full("block", 1);
  no_layers.recompute_num_layers.reset();
  EXPECT_TRUE(mentions(validate_recompute(no_layers, 4), "needs --recompute-num-layers between 1 and"));
  EXPECT_TRUE(mentions(validate_recompute(full("uniform", 5), 4), "--recompute-num-layers 5 must lie"));
  EXPECT_TRUE(mentions(validate_recompute(full("uniform", 0), 4), "--recompute-num-layers 0 must lie"));

  RecomputeConfig both = full("uniform", 1);
  both.recompute_activations = true;
  EXPECT_TRUE(mentions(validate_recompute(both, 4), "--recompute-activations means"));
  RecomputeConfig stray = selective({});
  stray.recompute_method = "block";
  stray.recompute_num_layers = 1;
  const std::vector<std::string> e = validate_recompute(stray, 4);
  EXPECT_TRUE(mentions(e, "--recompute-method block applies to --recompute-granularity full only"));
  EXPECT_TRUE(mentions(e, "--recompute-num-layers 1 applies to --recompute-granularity full only"));
  RecomputeConfig modules_alone;
  modules_alone.recompute_modules = {"mlp"};
  EXPECT_TRUE(mentions(validate_recompute(modules_alone, 4), "applies to --recompute-granularity selective"));
  EXPECT_TRUE(validate_recompute(selective({"moe", "moe_act"}), 4).empty());
  EXPECT_TRUE(validate_recompute(full("uniform", 1), 4).empty());  // with MoE layers too
  EXPECT_TRUE(
      mentions(validate_recompute(selective({"shared_experts"}), 4), "shared_experts: Megatron's module, not built"));
  EXPECT_TRUE(mentions(validate_recompute(selective({"attn"}), 4), "attn: unknown module"));

  // Megatron's deprecated --moe-layer-recompute: selective, moe beside the modules (the default
  // core_attn, or those given), and refused beside full.
  RecomputeConfig moe_layer;
  moe_layer.moe_layer_recompute = true;
  EXPECT_TRUE(validate_recompute(moe_layer, 4).empty());
  EXPECT_TRUE(moe_layer.selective());
  EXPECT_TRUE(moe_layer.recomputes("moe") && moe_layer.recomputes("core_attn") && !moe_layer.recomputes("mlp"));
  RecomputeConfig with_mlp = selective({"mlp"});
  with_mlp.moe_layer_recompute = true;
  EXPECT_TRUE(with_mlp.recomputes("moe") && with_mlp.recomputes("mlp") && !with_mlp.recomputes("core_attn"));
  RecomputeConfig with_full = full("uniform", 1);
  with_full.moe_layer_recompute = true;
  EXPECT_TRUE(mentions(validate_recompute(with_full, 4), "--moe-layer-recompute is Megatron's deprecated spelling"));
}

struct Pass {
  double loss;
  Tensor grads;
  int64_t activation_bytes;
  int64_t moe_layers;  // the MoE layers' routing statistics of the forward
  moe::MoEStats::Values moe_stats;
  std::vector<double> expert_loads;  // every router's tokens counted for its expert bias
};

// One forward and backward of a 3-layer tiny model with dropout and two documents per sequence.
Pass run(TransformerConfig config, const RecomputeConfig& recompute) {
  config.num_layers = 3;
  config.recompute = recompute;
  ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(config, ctx);
  model.parameters().initialize(42);
  const int64_t B = 2, S = config.seq_length;
  Tensor tokens = Tensor::empty({B, S}, DType::i32), labels = Tensor::empty({B, S}, DType::i32);
  Tensor mask = Tensor::empty({B, S}, DType::f32), segments = Tensor::empty({B, S}, DType::i32);
  HostRng rng(7);
  for (int64_t i = 0; i < B * S; ++i) {
    tokens.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(config.vocab_size)));
    labels.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(config.vocab_size)));
    mask.data<float>()[i] = i % 5 == 3 ? 0.0f : 1.0f;
    segments.data<int32_t>()[i] = int32_t(i % S >= S / 2);
  }
  model.parameters().zero_grads();
  const ForwardContext fwd{.training = true, .seed = 99, .step = 3};
  const LossSums sums = model.forward_backward(tokens, labels, mask, 0.125f, fwd, Tensor(), segments);
  Pass pass{sums.loss_sum,
            model.parameters().grad_buffer().clone(),
            model.activation_bytes(),
            model.moe_stats().layers,
            model.moe_stats().values(),
            {}};
  for (const moe::MoELayer* layer : model.moe_layers())
    for (double n : layer->router().tokens_since_update()) pass.expert_loads.push_back(n);
  return pass;
}

void expect_bit_identical(const Pass& a, const Pass& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << what << ": loss " << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.grads.nbytes(), b.grads.nbytes());
  EXPECT_EQ(std::memcmp(a.grads.raw(), b.grads.raw(), a.grads.nbytes()), 0) << what << ": gradients differ";
}

class RecomputeGradients : public ::testing::TestWithParam<bool> {};  // true: LLaMA style

TEST_P(RecomputeGradients, AreBitIdenticalToKeepingEverything) {
  const TransformerConfig config =
      GetParam() ? megatron::testing::llama_style(DType::f32) : megatron::testing::gpt2_style(DType::f32);
  const Pass kept = run(config, {});
  const std::vector<std::pair<std::string, RecomputeConfig>> settings = {
      {"full uniform 1", full("uniform", 1)},
      {"full uniform 2", full("uniform", 2)},
      {"full uniform 3", full("uniform", 3)},
      {"full block 2", full("block", 2)},
      {"selective core_attn", selective({})},
      {"selective mlp", selective({"mlp"})},
      {"selective core_attn mlp", selective({"core_attn", "mlp"})},
      {"selective layernorm", selective({"layernorm"})},
      {"selective core_attn mlp layernorm", selective({"core_attn", "mlp", "layernorm"})}};
  for (const auto& [what, recompute] : settings) {
    const Pass again = run(config, recompute);
    expect_bit_identical(kept, again, what);
    EXPECT_LT(again.activation_bytes, kept.activation_bytes) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, RecomputeGradients, ::testing::Bool());

// --qk-layernorm: the q/k norms' saved inputs rebuilt by a full recompute, kept under selective
// core_attn (whose rerun reads the normalised, rotated q and k).
TEST(RecomputeGradients, QkLayernormAreBitIdenticalToKeepingEverything) {
  TransformerConfig config = megatron::testing::llama_style(DType::f32);
  config.qk_layernorm = true;
  const Pass kept = run(config, {});
  for (const auto& [what, recompute] : std::vector<std::pair<std::string, RecomputeConfig>>{
           {"full uniform 1", full("uniform", 1)},
           {"selective core_attn", selective({})},
           {"selective core_attn mlp layernorm", selective({"core_attn", "mlp", "layernorm"})}})
    expect_bit_identical(kept, run(config, recompute), what);
}

// FP8 layers keep the forward's casts of x^T for the weight-gradient GEMMs, and under the delayed
// recipe SwiGLU writes fc2's input and fc1's output gradient as FP8 casts directly; recomputing
// the MLP (or the whole layer) takes the other path, the bf16 activation cast by the layer, and
// selective core_attn drops the out projection's kept cast. Gradients are bit-identical across
// them, per recipe.
TEST(RecomputeGradients, Fp8AreBitIdenticalToKeepingEverything) {
  for (const std::string recipe : {"delayed", "tensorwise", "blockwise"}) {
    TransformerConfig config = megatron::testing::llama_style(DType::f32);
    config.fp8.fp8_format = "hybrid";
    config.fp8.fp8_recipe = recipe;
    const Pass kept = run(config, {});
    for (const auto& [what, recompute] : std::vector<std::pair<std::string, RecomputeConfig>>{
             {"selective mlp", selective({"mlp"})},
             {"selective core_attn", selective({})},
             {"selective mlp layernorm", selective({"mlp", "layernorm"})},
             {"full uniform 1", full("uniform", 1)}}) {
      const Pass again = run(config, recompute);
      expect_bit_identical(kept, again, recipe + ", " + what);
      EXPECT_LT(again.activation_bytes, kept.activation_bytes) << recipe << ", " << what;
    }
  }
}

// MoE layers (0 and 2 of 3) with sigmoid routing, an expert bias, the aux and z losses, a shared
// expert and the grouped GEMM: full recomputation reruns their routing and experts, the moe module
// keeps only an MoE layer's input, moe_act drops the experts' activation output (recomputed from
// fc1's output). Gradients are bit-identical to keeping everything, and the routing
// statistics and the expert-bias loads are counted once, as without recomputation.
TEST(RecomputeGradients, MoEAreBitIdenticalToKeepingEverything) {
  TransformerConfig config = megatron::testing::llama_style(DType::f32);
  config.moe.num_moe_experts = 4;
  config.moe.moe_layer_freq = "2";
  config.moe.moe_ffn_hidden_size = 8;
  config.moe.moe_router_score_function = RouterScoreFunction::sigmoid;
  config.moe.moe_router_enable_expert_bias = true;
  config.moe.moe_aux_loss_coeff = 0.1;
  config.moe.moe_z_loss_coeff = 0.01;
  config.moe.moe_shared_expert_intermediate_size = 8;
  config.moe.moe_grouped_gemm = true;
  const Pass kept = run(config, {});
  ASSERT_EQ(kept.moe_layers, 2);
  ASSERT_EQ(kept.expert_loads.size(), 8u);
  const std::vector<std::pair<std::string, RecomputeConfig>> settings = {
      {"full uniform 1", full("uniform", 1)},
      {"full uniform 3", full("uniform", 3)},
      {"full block 2", full("block", 2)},
      {"selective moe", selective({"moe"})},
      {"selective moe_act", selective({"moe_act"})},
      {"selective core_attn moe", selective({"core_attn", "moe"})},
      {"selective layernorm", selective({"layernorm"})},
      {"moe layer recompute", [] {
         RecomputeConfig r;
         r.moe_layer_recompute = true;
         return r;
       }()}};
  for (const auto& [what, recompute] : settings) {
    const Pass again = run(config, recompute);
    expect_bit_identical(kept, again, what);
    EXPECT_EQ(again.expert_loads, kept.expert_loads) << what;
    EXPECT_EQ(again.moe_layers, kept.moe_layers) << what;
    EXPECT_EQ(again.moe_stats.load_balancing_loss, kept.moe_stats.load_balancing_loss) << what;
    EXPECT_EQ(again.moe_stats.min_tokens_per_expert, kept.moe_stats.min_tokens_per_expert) << what;
    EXPECT_EQ(again.moe_stats.max_tokens_per_expert, kept.moe_stats.max_tokens_per_expert) << what;
    EXPECT_LT(again.activation_bytes, kept.activation_bytes) << what;
  }
}

// The bytes each setting stops keeping, worked out from the GPT-2-style shapes (f32, 4 bytes):
// T = S·B = 12 tokens, H = 16, 4 heads, F = 32, 3 layers. Per layer the forward keeps
//   input norm: its input (T·H) and mean, rstd (T each)       = 216 floats
//   QKV projection's input (the norm's output, T·H)           = 192
//   the fused projection q|k|v read by attention (T·3H)       = 576
//   attention output (T·H, also the out projection's input)   = 192, log-sum-exp (B·heads·S) = 48
//   pre-MLP norm                                              = 216
//   fc1's input (T·H) and output (T·F)                        = 192 + 384
// i.e. 2016 floats; the last layer's block also holds the final norm (216 floats), whose output the
// output layer keeps. A full recompute of all layers in one group keeps the group's input instead,
// the embedding's output (T·H), which layer 0's input norm held (first counted there).
TEST(Recompute, ActivationMemoryDropsByWhatIsNoLongerSaved) {
  const TransformerConfig config = megatron::testing::gpt2_style(DType::f32);
  const int64_t T = 12, H = 16, F = 32, layers = 3, per_layer = 2016, final_norm = 216;
  const int64_t kept = run(config, {}).activation_bytes;
  EXPECT_EQ(kept - run(config, selective({})).activation_bytes, layers * (T * H + 48) * 4);
  EXPECT_EQ(kept - run(config, selective({"mlp"})).activation_bytes, layers * T * F * 4);
  // layernorm: the QKV projection's and fc1's inputs, the two norms' outputs (T·H each).
  EXPECT_EQ(kept - run(config, selective({"layernorm"})).activation_bytes, layers * 2 * T * H * 4);
  EXPECT_EQ(kept - run(config, full("uniform", 3)).activation_bytes, (layers * per_layer + final_norm - T * H) * 4);
  // uniform 1: every layer's input is kept: the embedding's output, then each pair (h, m) the
  // layer before returned (h is that layer's pre-MLP norm input; m its MLP output, T·H each).
  EXPECT_EQ(kept - run(config, full("uniform", 1)).activation_bytes,
            (layers * per_layer + final_norm - T * H - (layers - 1) * 2 * T * H) * 4);
  // block 1: only layer 0 is recomputed, keeping the embedding's output.
  EXPECT_EQ(kept - run(config, full("block", 1)).activation_bytes, (per_layer - T * H) * 4);
}

}  // namespace
