#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/models/gpt/presets.h"
#include "megatron/transformer/transformer_config.h"

using namespace megatron;

namespace {

// A preset with a vocabulary, derived as the argument parser would.
TransformerConfig preset_config(const std::string& name, int64_t vocab_size) {
  const ModelPreset* preset = find_model_preset(name);
  EXPECT_NE(preset, nullptr) << name;
  TransformerConfig config;
  if (preset != nullptr) apply_model_preset(*preset, config);
  config.vocab_size = vocab_size;
  derive_model_fields(config, 1);
  return config;
}

TransformerConfig tiny_config() { return preset_config("tiny", 100); }

// The one message among `errors` containing `part`, or a failure listing them all.
testing::AssertionResult has_error(const std::vector<std::string>& errors, const std::string& part) {
  for (const std::string& error : errors) {
    if (error.find(part) != std::string::npos) return testing::AssertionSuccess();
  }
  testing::AssertionResult result = testing::AssertionFailure() << "no error contains '" << part << "'; got:";
  for (const std::string& error : errors) result << "\n  " << error;
  return result;
}

}  // namespace

TEST(PaddedVocab, MegatronExamples) {
  EXPECT_EQ(padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 128, 2), 50432);  // the reference's TP=2 example
  EXPECT_EQ(padded_vocab_size(32000, 128, 1), 32000);  // already a multiple
  EXPECT_EQ(padded_vocab_size(257, 128, 1), 384);
  EXPECT_EQ(padded_vocab_size(32000, 128, 8), 32768);  // a multiple of 128 but not of 128 x 8
  EXPECT_EQ(padded_vocab_size(100, 32, 4), 128);
  EXPECT_THROW(padded_vocab_size(100, 0, 1), Error);
  EXPECT_THROW(padded_vocab_size(100, 128, 0), Error);
}

TEST(DeriveModelFields, MegatronDefaults) {
  TransformerConfig config;
  config.hidden_size = 4096;
  config.num_attention_heads = 32;
  config.seq_length = 2048;
  config.vocab_size = 50257;
  derive_model_fields(config, 1);
  EXPECT_EQ(config.ffn_hidden_size, 4 * 4096);
  EXPECT_EQ(config.kv_channels, 128);
  EXPECT_EQ(config.num_query_groups, 32);
  EXPECT_EQ(config.max_position_embeddings, 2048);
  EXPECT_EQ(config.padded_vocab_size, 50304);

  // SwiGLU: int((4*4096*2/3)/64)*64 = int(10922.67/64)*64 = 170*64.
  TransformerConfig swiglu = TransformerConfig{};
  swiglu.hidden_size = 4096;
  swiglu.swiglu = true;
  derive_model_fields(swiglu, 1);
  EXPECT_EQ(swiglu.ffn_hidden_size, 10880);
  swiglu = TransformerConfig{};
  swiglu.hidden_size = 64;
  swiglu.swiglu = true;
  derive_model_fields(swiglu, 1);
  EXPECT_EQ(swiglu.ffn_hidden_size, 128);  // int(170.67/64)*64

  // --group-query-attention without --num-query-groups is Megatron's default of one group.
  TransformerConfig gqa;
  gqa.hidden_size = 64;
  gqa.num_attention_heads = 4;
  gqa.group_query_attention = true;
  derive_model_fields(gqa, 1);
  EXPECT_EQ(gqa.num_query_groups, 1);
}

TEST(DeriveModelFields, KeepsGivenValues) {
  TransformerConfig config = tiny_config();
  config.ffn_hidden_size = 100;
  config.kv_channels = 32;
  config.max_position_embeddings = 512;
  derive_model_fields(config, 1);
  EXPECT_EQ(config.ffn_hidden_size, 100);
  EXPECT_EQ(config.kv_channels, 32);
  EXPECT_EQ(config.max_position_embeddings, 512);
}

TEST(DeriveModelFields, LeavesKvChannelsWhenHeadsDoNotDivide) {
  TransformerConfig config;
  config.hidden_size = 64;
  config.num_attention_heads = 5;
  derive_model_fields(config, 1);
  EXPECT_EQ(config.kv_channels, 0);  // validate() then explains why
}

TEST(Validate, PresetsAreValid) {
  for (const ModelPreset& preset : model_presets()) {
    const TransformerConfig config = preset_config(std::string(preset.name), 32000);
    EXPECT_TRUE(validate(config).empty()) << preset.name << ": " << validate(config).front();
  }
}

TEST(Validate, RequiredFields) {
  const std::vector<std::string> errors = validate(TransformerConfig{});
  EXPECT_TRUE(has_error(errors, "--num-layers is required"));
  EXPECT_TRUE(has_error(errors, "--hidden-size is required"));
  EXPECT_TRUE(has_error(errors, "--num-attention-heads is required"));
  EXPECT_TRUE(has_error(errors, "--seq-length is required"));
  EXPECT_TRUE(has_error(errors, "vocab size 0 must be positive"));
}

TEST(Validate, HeadsMustDivideHidden) {
  TransformerConfig config = tiny_config();
  config.num_attention_heads = 5;
  config.kv_channels = 0;
  config.num_query_groups = 5;
  EXPECT_TRUE(has_error(validate(config),
                        "--num-attention-heads 5 does not divide --hidden-size 64: hidden_size must be a multiple of "
                        "num_attention_heads; choose e.g. 4 or 8 heads, or set --kv-channels"));
  config.kv_channels = 16;  // an explicit head dimension lifts the rule, as in Megatron
  EXPECT_TRUE(validate(config).empty()) << validate(config).front();
}

TEST(Validate, QueryGroups) {
  TransformerConfig config = preset_config("llama-tiny", 100);
  config.num_query_groups = 3;
  EXPECT_TRUE(has_error(validate(config), "--num-query-groups 3 does not divide --num-attention-heads 4"));
  config = tiny_config();
  config.num_query_groups = 2;
  EXPECT_TRUE(has_error(validate(config), "without --group-query-attention"));
}

TEST(Validate, Positions) {
  TransformerConfig config = tiny_config();
  config.seq_length = 256;
  EXPECT_TRUE(has_error(validate(config), "--seq-length 256 exceeds --max-position-embeddings 128"));

  config = preset_config("llama-tiny", 100);  // kv_channels 16
  config.rotary_percent = 0.0f;
  EXPECT_TRUE(has_error(validate(config), "--rotary-percent 0 must lie in (0, 1]"));
  config.rotary_percent = 1.5f;
  EXPECT_TRUE(has_error(validate(config), "--rotary-percent 1.5 must lie in (0, 1]"));
  config.rotary_percent = 0.5625f;  // int(16 * 0.5625) = 9, odd
  EXPECT_TRUE(has_error(validate(config), "= 9: RoPE rotates pairs"));
  config.rotary_percent = 0.5f;
  EXPECT_TRUE(validate(config).empty());
}

TEST(Validate, Regularization) {
  TransformerConfig config = tiny_config();
  config.attention_dropout = 1.0f;
  config.hidden_dropout = -0.1f;
  config.layernorm_epsilon = 0.0f;
  const std::vector<std::string> errors = validate(config);
  EXPECT_TRUE(has_error(errors, "--attention-dropout 1 must lie in [0, 1)"));
  EXPECT_TRUE(has_error(errors, "--hidden-dropout -0.1 must lie in [0, 1)"));
  EXPECT_TRUE(has_error(errors, "--norm-epsilon 0 must be positive"));
  EXPECT_EQ(errors.size(), 3u);
}

TEST(Validate, TensorParallelSplits) {
  TransformerConfig config = preset_config("llama-tiny", 100);  // 4 heads, 2 query groups, ffn 176
  config.padded_vocab_size = padded_vocab_size(100, 128, 2);
  const ParallelArgs tp2{.tensor_model_parallel_size = 2, .sequence_parallel = true};
  EXPECT_TRUE(validate_tensor_parallel_split(config, tp2).empty())
      << validate_tensor_parallel_split(config, tp2).front();
  const ParallelArgs tp4{.tensor_model_parallel_size = 4, .sequence_parallel = true};  // more ranks than groups
  config.seq_length = 126;
  config.padded_vocab_size = 130;  // a checkpoint's, padded for another TP: derivation always gives a multiple
  const std::vector<std::string> errors = validate_tensor_parallel_split(config, tp4);
  EXPECT_TRUE(has_error(errors, "--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"));
  EXPECT_TRUE(has_error(errors, "--seq-length 126 is not divisible by --tensor-model-parallel-size 4"));
  EXPECT_TRUE(has_error(errors, "the padded vocabulary (130 rows) is not divisible by --tensor-model-parallel-size 4"));
  EXPECT_EQ(errors.size(), 3u);
  // Sequence parallelism takes no effect at TP 1 (Megatron), so neither does its rule.
  EXPECT_TRUE(
      validate_tensor_parallel_split(config, {.tensor_model_parallel_size = 1, .sequence_parallel = true}).empty());
}

// Expert parallelism: whole experts per EP rank, and EP only for a model with experts.
TEST(Validate, ExpertParallelSplits) {
  TransformerConfig config = preset_config("moe-tiny", 100);  // 4 experts
  EXPECT_TRUE(validate_tensor_parallel_split(config, {.expert_model_parallel_size = 4}).empty());
  std::vector<std::string> errors = validate_tensor_parallel_split(config, {.expert_model_parallel_size = 3});
  EXPECT_TRUE(has_error(errors, "--num-experts 4 is not divisible by --expert-model-parallel-size 3"));
  EXPECT_EQ(errors.size(), 1u);
  errors = validate_tensor_parallel_split(tiny_config(), {.expert_model_parallel_size = 2});
  EXPECT_TRUE(has_error(errors, "this model has none (no --num-experts): add --num-experts N"));
  EXPECT_EQ(errors.size(), 1u);
  // Under TP (expert TP = TP): Megatron's sequence-parallel rule, and every expert's FFN split.
  EXPECT_TRUE(validate_tensor_parallel_split(
                  config, {.tensor_model_parallel_size = 2, .expert_model_parallel_size = 2, .sequence_parallel = true})
                  .empty());
  errors = validate_tensor_parallel_split(config, {.tensor_model_parallel_size = 2});
  EXPECT_TRUE(has_error(errors, "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel"));
  EXPECT_EQ(errors.size(), 1u);
  config.moe.moe_ffn_hidden_size = 63;
  errors = validate_tensor_parallel_split(config, {.tensor_model_parallel_size = 2, .sequence_parallel = true});
  EXPECT_TRUE(has_error(errors, "--moe-ffn-hidden-size 63 is not divisible by the expert TP size 2"));
  EXPECT_EQ(errors.size(), 1u);
}

TEST(NumParameters, Gpt2Small) {
  // GPT-2 124M, tied, padded vocab V = 50304, h = 768, L = 12, positions P = 1024:
  //   word embeddings V*h = 38,633,472; positions P*h = 786,432
  //   per layer: 2 LayerNorms 2*(2h) = 3,072; QKV h*3h + 3h = 1,771,776; proj h*h + h = 590,592;
  //              fc1 h*4h + 4h = 2,362,368; fc2 4h*h + h = 2,360,064  -> 7,087,872, times 12 = 85,054,464
  //   final LayerNorm 2h = 1,536
  //   total 38,633,472 + 786,432 + 85,054,464 + 1,536 = 124,475,904
  TransformerConfig config = preset_config("gpt2-124m", 50257);
  ASSERT_EQ(config.padded_vocab_size, 50304);
  EXPECT_EQ(num_parameters(config), 124475904);
  // Untied adds an output layer of V*h = 38,633,472 (no bias).
  config.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(num_parameters(config), 124475904 + 38633472);
}

TEST(NumParameters, LlamaTiny) {
  // llama-tiny with vocab 256 (already a multiple of 128): h = 64, 4 heads, 2 groups, d = 16, F = 176.
  //   embeddings 256*64 = 16,384; output layer (untied) 16,384
  //   per layer: 2 RMSNorms 2*64 = 128; QKV 64*(64 + 2*2*16) = 8,192; proj 64*64 = 4,096;
  //              fc1 64*(2*176) = 22,528; fc2 176*64 = 11,264  -> 46,208, times 2 = 92,416
  //   final RMSNorm 64; no biases, no position table
  //   total 16,384 + 16,384 + 92,416 + 64 = 125,248
  TransformerConfig config = preset_config("llama-tiny", 256);
  EXPECT_EQ(num_parameters(config), 125248);
  // --qk-layernorm adds two RMSNorms over d = 16 a layer: 125,248 + 2*2*16 = 125,312; as
  // LayerNorms (weight and bias) they add 2*2*2*16 = 128 beside the LayerNorms' own biases.
  config.qk_layernorm = true;
  EXPECT_EQ(num_parameters(config), 125312);
  const int64_t layernorm = [&] {
    TransformerConfig c = config;
    c.normalization = Normalization::LayerNorm;
    const int64_t with_qk = num_parameters(c);
    c.qk_layernorm = false;
    return with_qk - num_parameters(c);
  }();
  EXPECT_EQ(layernorm, 128);
}

// All FLOP counts below are integers under 2^53, so double arithmetic is exact whatever the
// order of operations; DOUBLE_EQ (4 ulp) only guards against a different summation order.
TEST(Flops, MatchesMhaGeluSanityFormula) {
  // Reference §5.2: with MHA, GELU and F = 4h the count is B*s*L*(72h^2 + 6*s*h) + 6*B*s*h*V.
  const TransformerConfig config = preset_config("gpt2-124m", 50257);
  const double B = 8, s = 1024, L = 12, h = 768, V = 50304;
  const double expected = B * s * L * (72 * h * h + 6 * s * h) + 6 * B * s * h * V;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 8), expected);
}

TEST(Flops, LlamaStyleByHand) {
  // llama-tiny, V = 256, B = 2, s = 128, L = 2, h = 64, n = 4, g = 2, d = 16, F = 176, e = 3:
  //   attn_proj = 6*(64*(64 + 2*2*16) + 64*64) = 73,728
  //   mlp       = 6*64*176*3 = 202,752
  //   logits    = 6*64*256 = 98,304
  //   per token = 2*202,752 + 2*73,728 + 98,304 = 651,264; times B*s = 256 -> 166,723,584
  //   attention = B*s^2*L*6*n*d = 2*16384*2*384 = 25,165,824
  //   total 191,889,408
  const TransformerConfig config = preset_config("llama-tiny", 256);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 2), 191889408.0);
}

TEST(Flops, MoEByHand) {
  // moe-tiny = llama-tiny with every MLP replaced by 4 experts of F_e = 64, top-2 (V = 256, B = 2):
  //   mlp_moe   = 6*64*(64*2*3) = 147,456 (reference §5.2: k experts per token)
  //   per token = 2*147,456 + 2*73,728 + 98,304 = 540,672; times B*s = 256 -> 138,412,032
  //   plus attention 25,165,824 = 163,577,856
  const TransformerConfig config = preset_config("moe-tiny", 256);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(config, 2), 163577856.0);
  // Parameters: each layer's MLP (22,528 + 11,264) becomes a router 4*64 and experts 4*3*64*64:
  //   125,248 + 2*(256 + 49,152 - 33,792) = 156,480
  EXPECT_EQ(num_parameters(config), 156480);
  EXPECT_EQ(moe_layer_count(config), 2);
}

TEST(Presets, BenchmarkShapes) {
  const TransformerConfig l8 = preset_config("llama-8b", 128256);
  EXPECT_EQ(l8.num_layers, 32);
  EXPECT_EQ(l8.hidden_size, 4096);
  EXPECT_EQ(l8.num_attention_heads, 32);
  EXPECT_EQ(l8.num_query_groups, 8);
  EXPECT_EQ(l8.ffn_hidden_size, 14336);
  EXPECT_EQ(l8.kv_channels, 128);
  EXPECT_EQ(l8.rotary_base, 500000.0f);
  EXPECT_EQ(l8.padded_vocab_size, 128256);
  EXPECT_EQ(l8.normalization, Normalization::RMSNorm);
  EXPECT_TRUE(l8.swiglu && l8.untie_embeddings_and_output_weights && !l8.add_bias_linear);
  EXPECT_EQ(l8.position_embedding_type, PositionEmbeddingType::rope);
  EXPECT_EQ(l8.max_position_embeddings, 2048);  // derived from seq_length

  const TransformerConfig l1 = preset_config("llama-1b", 32000);
  EXPECT_EQ(l1.num_layers, 16);
  EXPECT_EQ(l1.ffn_hidden_size, 5632);
  EXPECT_EQ(l1.rotary_base, 10000.0f);
  const TransformerConfig l3 = preset_config("llama-3b", 32000);
  EXPECT_EQ(l3.num_layers, 26);
  EXPECT_EQ(l3.hidden_size, 3072);
  EXPECT_EQ(l3.num_attention_heads, 24);
  EXPECT_EQ(l3.ffn_hidden_size, 8192);

  const TransformerConfig tiny = tiny_config();
  EXPECT_EQ(tiny.ffn_hidden_size, 256);  // derived 4h
  EXPECT_EQ(tiny.normalization, Normalization::LayerNorm);
  EXPECT_FALSE(tiny.untie_embeddings_and_output_weights);
  const TransformerConfig gpt2_xl = preset_config("gpt2-1.5b", 50257);
  EXPECT_EQ(gpt2_xl.kv_channels, 64);  // 1600 / 25
}

TEST(Presets, LookupAndNames) {
  EXPECT_EQ(find_model_preset("gpt3-175b"), nullptr);
  EXPECT_EQ(model_presets().size(), 13u);
  EXPECT_EQ(model_preset_names(),
            "tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama-tiny, llama-1b, llama-3b, llama-8b, moe-tiny, "
            "deepseek-tiny, moe-1b-8x, mixtral-8x7b");
}

TEST(Presets, MoEShapes) {
  const TransformerConfig mixtral = preset_config("mixtral-8x7b", 32000);
  EXPECT_EQ(mixtral.moe.num_moe_experts, 8);
  EXPECT_EQ(mixtral.moe.moe_router_topk, 2);
  EXPECT_EQ(mixtral.moe.moe_ffn_hidden_size, 14336);
  EXPECT_EQ(mixtral.moe.moe_router_score_function, RouterScoreFunction::softmax);
  const TransformerConfig deepseek = preset_config("deepseek-tiny", 32000);
  EXPECT_EQ(deepseek.moe.moe_router_score_function, RouterScoreFunction::sigmoid);
  EXPECT_TRUE(deepseek.moe.moe_router_enable_expert_bias);
  EXPECT_EQ(deepseek.moe.moe_shared_expert_intermediate_size, 64);
  EXPECT_EQ(deepseek.moe.moe_router_num_groups, 4);
  // A dense preset applied after an MoE one leaves no experts behind.
  TransformerConfig config = deepseek;
  apply_model_preset(*find_model_preset("llama-tiny"), config);
  EXPECT_FALSE(config.moe.enabled());
}
