// The Hugging Face mappings on their own: the fused QKV and [gate; up] layouts against layouts
// worked out by hand, export undoing import byte for byte, and config.json fields read, refused
// or reported as unknown. (Whole checkpoints of every family: tests/e2e/test_hf_bridge.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "megatron/hf_bridge/hf_config.h"
#include "megatron/hf_bridge/hf_family.h"
#include "megatron/hf_bridge/tensor_mapping.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::hf_bridge;
using megatron::testing::error_of;

namespace {

// A LLaMA-like model (RMSNorm, SwiGLU, RoPE, no biases): what the LLaMA family and its relatives
// export from.
TransformerConfig llama_like() {
  TransformerConfig c;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.position_embedding_type = PositionEmbeddingType::rope;
  c.add_bias_linear = false;
  return c;
}

// A config.json's Megatron flags, by flag.
std::map<std::string, std::string> model_flags(const nlohmann::json& config) {
  std::map<std::string, std::string> flags;
  for (const auto& [flag, value] : read_hf_config(config, "c.json").model_flags) flags[flag] = value;
  return flags;
}

// Rows numbered by value: row i of a tensor of `rows` rows and `cols` columns holds base + i.
Tensor numbered_rows(int64_t rows, int64_t cols, float base) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(base + float(i));
  return Tensor::from_vector(v, cols == 0 ? Shape{rows} : Shape{rows, cols});
}

std::vector<float> first_column(const Tensor& t) {
  std::vector<float> out;
  const int64_t cols = t.ndim() == 2 ? t.dim(1) : 1;
  for (int64_t i = 0; i < t.dim(0); ++i) out.push_back(t.data<float>()[i * cols]);
  return out;
}

TransformerConfig gqa_config() {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 3;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 1;
  c.ffn_hidden_size = 2;
  return c;
}

const TensorRule* rule_named(const std::vector<TensorRule>& rules, const std::string& ours) {
  for (const TensorRule& r : rules)
    if (r.ours == ours) return &r;
  return nullptr;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST(HfMapping, QkvGroupsFollowMegatronsPerGroupLayout) {
  // 4 query heads in 2 groups, head dim 1: group g holds q heads 2g, 2g+1, then k_g, then v_g.
  const TransformerConfig c = gqa_config();
  const auto rules = tensor_rules(Family::llama, c, "");
  const TensorRule* qkv = rule_named(rules, "decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  const std::vector<Tensor> hf = {numbered_rows(4, 3, 0), numbered_rows(2, 3, 10), numbered_rows(2, 3, 20)};
  const Tensor ours = to_ours(*qkv, hf, {8, 3}, c, 0);
  EXPECT_EQ(first_column(ours), (std::vector<float>{0, 1, 10, 20, 2, 3, 11, 21}));
  const std::vector<Tensor> back = to_hf(*qkv, ours, c, 0);
  for (size_t i = 0; i < hf.size(); ++i) EXPECT_TRUE(same_bytes(back[i], hf[i])) << qkv->hf[i];
}

TEST(HfMapping, Gpt2PackedQkvIsTransposedAndRegrouped) {
  // GPT-2 is multi-head: every head its own group, [q_h; k_h; v_h]. c_attn is a Conv1D weight
  // [in, 3*out] whose columns are [Q | K | V].
  TransformerConfig c = gqa_config();
  c.num_query_groups = c.num_attention_heads = 2;
  c.hidden_size = 2;
  const auto rules = tensor_rules(Family::gpt2, c, "transformer.");
  const TensorRule* qkv = rule_named(rules, "decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->hf, std::vector<std::string>{"transformer.h.0.attn.c_attn.weight"});
  // Column j of c_attn holds j in every row: Q = columns 0,1, K = 2,3, V = 4,5.
  std::vector<float> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 6; ++j) v.push_back(float(j));
  const Tensor c_attn = Tensor::from_vector(v, {2, 6});
  EXPECT_EQ(hf_shapes(*qkv, {6, 2}, c, 0), std::vector<Shape>{Shape({2, 6})});
  const Tensor ours = to_ours(*qkv, {c_attn}, {6, 2}, c, 0);
  EXPECT_EQ(first_column(ours), (std::vector<float>{0, 2, 4, 1, 3, 5}));  // [q0 k0 v0 q1 k1 v1]
  EXPECT_TRUE(same_bytes(to_hf(*qkv, ours, c, 0).front(), c_attn));
}

TEST(HfMapping, GateUpStackAndVocabPadding) {
  const TransformerConfig c = gqa_config();
  const auto rules = tensor_rules(Family::llama, c, "");
  const TensorRule* fc1 = rule_named(rules, "decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_NE(fc1, nullptr);
  const Tensor ours = to_ours(*fc1, {numbered_rows(2, 3, 0), numbered_rows(2, 3, 10)}, {4, 3}, c, 0);
  EXPECT_EQ(first_column(ours), (std::vector<float>{0, 1, 10, 11}));  // [gate; up]

  const TensorRule* embedding = rule_named(rules, "embedding.word_embeddings.weight");
  ASSERT_NE(embedding, nullptr);
  const Tensor padded = to_ours(*embedding, {numbered_rows(5, 3, 1)}, {8, 3}, c, 5);
  EXPECT_EQ(first_column(padded), (std::vector<float>{1, 2, 3, 4, 5, 0, 0, 0}));  // padding rows zero
  EXPECT_EQ(to_hf(*embedding, padded, c, 5).front().shape(), Shape({5, 3}));
}

TEST(HfMapping, ConfigFieldsBecomeMegatronFlags) {
  const nlohmann::json mistral = {{"model_type", "mistral"},  {"architectures", {"MistralForCausalLM"}},
                                  {"hidden_size", 64},        {"intermediate_size", 128},
                                  {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2}, {"max_position_embeddings", 256},
                                  {"rms_norm_eps", 1e-5},     {"rope_theta", 1000000.0},
                                  {"sliding_window", 4},      {"hidden_act", "silu"},
                                  {"vocab_size", 320},        {"tie_word_embeddings", false},
                                  {"torch_dtype", "float32"}};
  const HfModelConfig hf = read_hf_config(mistral, "config.json");
  EXPECT_EQ(hf.family, Family::mistral);
  EXPECT_EQ(hf.vocab_rows, 320);
  const auto value = [&](const std::string& flag) {
    for (const auto& [f, v] : hf.model_flags)
      if (f == flag) return v;
    return std::string("(absent)");
  };
  EXPECT_EQ(value("--window-size"), "3,0");  // transformers' window of 4 keys: the query and 3 before
  EXPECT_EQ(value("--num-query-groups"), "2");
  EXPECT_EQ(value("--rotary-base"), "1e+06");
  EXPECT_EQ(value("--norm-epsilon"), "1e-05");
  EXPECT_EQ(value("--untie-embeddings-and-output-weights"), "true");

  nlohmann::json llama3 = mistral;
  llama3.erase("sliding_window");
  llama3["model_type"] = "llama";
  llama3["architectures"] = {"LlamaForCausalLM"};
  llama3.erase("rope_theta");
  llama3["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                               {"factor", 32.0},          {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const HfModelConfig l = read_hf_config(llama3, "config.json");
  bool scaled = false;
  for (const auto& [f, v] : l.model_flags) scaled |= f == "--rope-scaling-factor" && v == "32";
  EXPECT_TRUE(scaled);
}

TEST(HfMapping, ConfigFieldsWeCannotBuildAreErrorsNamingThem) {
  const nlohmann::json base = {{"model_type", "llama"},  {"hidden_size", 64},        {"intermediate_size", 128},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"max_position_embeddings", 64},
                               {"vocab_size", 320},      {"hidden_act", "silu"}};
  EXPECT_EQ(error_of([&] { read_hf_config(base, "c.json"); }), "(no error)");
  const auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = base;
    j[key] = value;
    return error_of([&] { read_hf_config(j, "c.json"); });
  };
  EXPECT_NE(with("model_type", "bert").find("model_type \"bert\" is not a family we import"), std::string::npos);
  EXPECT_NE(with("hidden_act", "gelu").find("\"hidden_act\" is \"gelu\""), std::string::npos);
  EXPECT_NE(with("attention_bias", true).find("\"attention_bias\" is true"), std::string::npos);
  EXPECT_NE(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}).find("rope_type \"yarn\""),
            std::string::npos);
  EXPECT_NE(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 2.0}})
                .find("low_freq_factor"),
            std::string::npos);
  EXPECT_NE(with("qk_layernorm", true).find("field(s) we do not map: qk_layernorm = true"), std::string::npos);
  nlohmann::json no_layers = base;
  no_layers.erase("num_hidden_layers");
  EXPECT_NE(error_of([&] { read_hf_config(no_layers, "c.json"); }).find("no \"num_hidden_layers\""), std::string::npos);
}

// Linear RoPE scaling (position interpolation) is --rotary-seq-len-interpolation-factor, both ways;
// Megatron's factor is a whole number, so a fractional one is refused, as is a model with both
// scalings (config.json holds one).
TEST(HfMapping, LinearRopeScalingIsTheInterpolationFactor) {
  const nlohmann::json base = {{"model_type", "llama"},  {"hidden_size", 64},        {"intermediate_size", 128},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"max_position_embeddings", 64},
                               {"vocab_size", 320},      {"hidden_act", "silu"}};
  nlohmann::json linear = base;
  linear["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(model_flags(linear)["--rotary-seq-len-interpolation-factor"], "4");
  EXPECT_EQ(model_flags(linear).count("--use-rope-scaling"), 0u);
  EXPECT_EQ(model_flags(base).count("--rotary-seq-len-interpolation-factor"), 0u);
  linear["rope_scaling"]["factor"] = 2.5;
  EXPECT_NE(error_of([&] { read_hf_config(linear, "c.json"); }).find("linear rope scaling with factor 2.5"),
            std::string::npos);

  TransformerConfig c = llama_like();
  c.rotary_seq_len_interpolation_factor = 4;
  const nlohmann::json exported = hf_config_json(Family::llama, c, 320, DType::f32, {});
  EXPECT_EQ(exported["rope_scaling"], nlohmann::json({{"rope_type", "linear"}, {"factor", 4.0}}));
  EXPECT_EQ(family_of_model(c), Family::llama);
  c.window_size_left = 3;
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("takes no QKV bias and no RoPE scaling"), std::string::npos);
  c.window_size_left = -1;
  c.use_rope_scaling = true;
  EXPECT_NE(error_of([&] { hf_config_json(Family::llama, c, 320, DType::f32, {}); }).find("holds one RoPE scaling"),
            std::string::npos);
}

// Export: a LLaMA-like model with --qk-layernorm is Qwen3's; with a QKV bias or a sliding window,
// or GPT-2-like, it has no family (its norms or those features would be dropped).
TEST(HfMapping, QkLayernormModelsExportAsQwen3) {
  TransformerConfig c = llama_like();
  EXPECT_EQ(family_of_model(c), Family::llama);
  c.qk_layernorm = true;
  EXPECT_EQ(family_of_model(c), Family::qwen3);
  c.add_qkv_bias = true;
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("exports as Qwen3"), std::string::npos);
  TransformerConfig gpt2;
  gpt2.qk_layernorm = true;
  EXPECT_NE(error_of([&] { family_of_model(gpt2); }).find("no --qk-layernorm"), std::string::npos);
}

// Qwen3's config: --qk-layernorm, head_dim (128 when absent, Qwen3Config's default; --kv-channels
// only where it differs from hidden / heads, Megatron's default), no biases.
TEST(HfMapping, Qwen3ConfigFields) {
  const nlohmann::json base = {{"model_type", "qwen3"},       {"hidden_size", 64},
                               {"intermediate_size", 128},    {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},    {"num_key_value_heads", 2},
                               {"vocab_size", 320},           {"max_position_embeddings", 64},
                               {"use_sliding_window", false}, {"sliding_window", nullptr},
                               {"max_window_layers", 28}};
  std::map<std::string, std::string> f = model_flags(base);
  EXPECT_EQ(f["--qk-layernorm"], "true");
  EXPECT_EQ(f["--kv-channels"], "128");
  EXPECT_EQ(f.count("--add-qkv-bias"), 0u);
  nlohmann::json with_dim = base;
  with_dim["head_dim"] = 32;
  EXPECT_EQ(model_flags(with_dim)["--kv-channels"], "32");
  with_dim["head_dim"] = 16;  // 64 / 4 heads
  EXPECT_EQ(model_flags(with_dim).count("--kv-channels"), 0u);
  with_dim["head_dim"] = nullptr;  // as transformers v5 writes an unset one: Qwen3's 128
  EXPECT_EQ(model_flags(with_dim)["--kv-channels"], "128");
  nlohmann::json biased = base;
  biased["attention_bias"] = true;
  EXPECT_NE(error_of([&] { read_hf_config(biased, "c.json"); }).find("\"attention_bias\" is true"), std::string::npos);
}

// Mixtral's config: experts and top k from num_local_experts and num_experts_per_tok, a router
// jitter (which would change training) refused; export picks Mixtral for an every-layer MoE model
// with Megatron's default softmax router, and refuses what it cannot describe.
TEST(HfMapping, MixtralConfigAndFamily) {
  const nlohmann::json base = {{"model_type", "mixtral"},
                               {"hidden_size", 64},
                               {"intermediate_size", 128},
                               {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},
                               {"vocab_size", 320},
                               {"max_position_embeddings", 64},
                               {"num_local_experts", 8},
                               {"num_experts_per_tok", 2},
                               {"router_aux_loss_coef", 0.02},
                               {"output_router_logits", false},
                               {"router_jitter_noise", 0.0},
                               {"sliding_window", nullptr}};
  std::map<std::string, std::string> flags = model_flags(base);
  EXPECT_EQ(flags["--num-experts"], "8");
  EXPECT_EQ(flags["--moe-router-topk"], "2");
  EXPECT_EQ(flags["--ffn-hidden-size"], "128");
  EXPECT_EQ(flags.count("--window-size"), 0u);
  nlohmann::json jitter = base;
  jitter["router_jitter_noise"] = 0.01;
  EXPECT_NE(error_of([&] { read_hf_config(jitter, "c.json"); }).find("\"router_jitter_noise\" is 0.01"),
            std::string::npos);

  TransformerConfig c = llama_like();
  c.num_layers = 2;
  c.ffn_hidden_size = 128;
  c.moe.num_moe_experts = 8;
  c.moe.moe_ffn_hidden_size = 128;
  EXPECT_EQ(family_of_model(c), Family::mixtral);
  c.moe.moe_router_pre_softmax = true;
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("Mixtral takes"), std::string::npos);
  c.moe.moe_router_pre_softmax = false;
  c.moe.moe_shared_expert_intermediate_size = 64;  // ungated: not Qwen2-MoE's either
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("exports as Qwen2-MoE"), std::string::npos);
  c.moe.moe_shared_expert_gate = true;
  EXPECT_EQ(family_of_model(c), Family::qwen2_moe);
}

// Qwen3-MoE's config: which layers are sparse from mlp_only_layers and decoder_sparse_step (layer i
// when unlisted and (i + 1) % step == 0, transformers' rule) as --moe-layer-freq, the experts'
// width, norm_topk_prob false (Qwen3MoeConfig's default) as --moe-router-pre-softmax,
// num_key_value_heads 4 and head_dim hidden / heads when absent (Qwen3MoeConfig's, not Qwen3's
// 128), the expert count under either of transformers' names; a layer index out of range is an
// error naming it. Export picks Qwen3-MoE for an MoE model
// with --qk-layernorm, and refuses what its router cannot describe.
TEST(HfMapping, Qwen3MoeConfigAndFamily) {
  const nlohmann::json base = {{"model_type", "qwen3_moe"},     {"hidden_size", 64},
                               {"intermediate_size", 128},      {"num_hidden_layers", 4},
                               {"num_attention_heads", 8},      {"vocab_size", 320},
                               {"max_position_embeddings", 64}, {"num_experts", 8},
                               {"num_experts_per_tok", 2},      {"moe_intermediate_size", 32},
                               {"router_aux_loss_coef", 0.001}, {"output_router_logits", false},
                               {"use_sliding_window", false},   {"sliding_window", nullptr}};
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = base;
    j[key] = value;
    return j;
  };
  std::map<std::string, std::string> f = model_flags(base);
  EXPECT_EQ(f["--num-experts"], "8");
  EXPECT_EQ(f["--moe-router-topk"], "2");
  EXPECT_EQ(f["--moe-ffn-hidden-size"], "32");
  EXPECT_EQ(f["--ffn-hidden-size"], "128");
  EXPECT_EQ(f["--moe-layer-freq"], "1");
  EXPECT_EQ(f["--moe-router-pre-softmax"], "true");
  EXPECT_EQ(f["--qk-layernorm"], "true");
  EXPECT_EQ(f["--num-query-groups"], "4");
  EXPECT_EQ(f.count("--kv-channels"), 0u);  // hidden / heads
  EXPECT_EQ(model_flags(with("norm_topk_prob", true)).count("--moe-router-pre-softmax"), 0u);
  EXPECT_EQ(model_flags(with("decoder_sparse_step", 2))["--moe-layer-freq"], "[0,1,0,1]");
  EXPECT_EQ(model_flags(with("mlp_only_layers", {0, 2}))["--moe-layer-freq"], "[0,1,0,1]");
  nlohmann::json both = with("decoder_sparse_step", 2);
  both["mlp_only_layers"] = {3};
  EXPECT_EQ(model_flags(both)["--moe-layer-freq"], "[0,1,0,0]");
  EXPECT_NE(error_of([&] {
              read_hf_config(with("mlp_only_layers", {4}), "c.json");
            }).find("\"mlp_only_layers\" holds 4, not a layer index in [0, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_hf_config(with("norm_topk_prob", 1), "c.json"); }).find("not true or false"),
            std::string::npos);
  // transformers v5 writes the expert count as num_local_experts.
  nlohmann::json v5 = base;
  v5.erase("num_experts");
  v5["num_local_experts"] = 6;
  EXPECT_EQ(model_flags(v5)["--num-experts"], "6");
  EXPECT_NE(error_of([&] {
              read_hf_config(with("num_local_experts", 6), "c.json");
            }).find("\"num_experts\" 8 and \"num_local_experts\" 6 disagree"),
            std::string::npos);

  TransformerConfig c = llama_like();
  c.num_layers = 4;
  c.ffn_hidden_size = 128;
  c.moe.num_moe_experts = 8;
  c.moe.moe_ffn_hidden_size = 32;
  c.moe.moe_layer_freq = "[0,1,0,1]";
  c.moe.moe_router_pre_softmax = true;
  // Mixtral cannot describe dense layers, other expert widths or pre-softmax routing; the message
  // names the way to Qwen3-MoE.
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("exports as Qwen3-MoE"), std::string::npos);
  c.qk_layernorm = true;
  EXPECT_EQ(family_of_model(c), Family::qwen3_moe);
  c.moe.moe_shared_expert_intermediate_size = 64;
  EXPECT_NE(error_of([&] { family_of_model(c); }).find("exports as Qwen3-MoE, which takes"), std::string::npos);
}

// Qwen2-MoE's config: Qwen3-MoE's MoE fields (here at their Qwen2MoeConfig defaults when absent:
// 60 experts, top 4, experts of 1408) and a shared expert of shared_expert_intermediate_size
// (5632 when absent), always gated; qkv_bias (true when absent) as --add-qkv-bias.
TEST(HfMapping, Qwen2MoeConfigFields) {
  const nlohmann::json base = {
      {"model_type", "qwen2_moe"},     {"hidden_size", 64},           {"intermediate_size", 128},
      {"num_hidden_layers", 2},        {"num_attention_heads", 16},   {"vocab_size", 320},
      {"max_position_embeddings", 64}, {"use_sliding_window", false}, {"shared_expert_intermediate_size", 96}};
  std::map<std::string, std::string> f = model_flags(base);
  EXPECT_EQ(f["--num-experts"], "60");
  EXPECT_EQ(f["--moe-router-topk"], "4");
  EXPECT_EQ(f["--moe-ffn-hidden-size"], "1408");
  EXPECT_EQ(f["--moe-shared-expert-intermediate-size"], "96");
  EXPECT_EQ(f["--moe-shared-expert-gate"], "true");
  EXPECT_EQ(f["--moe-router-pre-softmax"], "true");
  EXPECT_EQ(f["--add-qkv-bias"], "true");
  EXPECT_EQ(f.count("--qk-layernorm"), 0u);
  EXPECT_EQ(f.count("--num-query-groups"), 0u);  // 16 heads, 16 groups (the default)
  nlohmann::json unbiased = base;
  unbiased["qkv_bias"] = false;
  EXPECT_EQ(model_flags(unbiased).count("--add-qkv-bias"), 0u);
  nlohmann::json no_shared = base;
  no_shared.erase("shared_expert_intermediate_size");
  EXPECT_EQ(model_flags(no_shared)["--moe-shared-expert-intermediate-size"], "5632");
}
