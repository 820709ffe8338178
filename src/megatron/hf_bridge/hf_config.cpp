#include "megatron/hf_bridge/hf_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "megatron/core/error.h"
#include "megatron/flags/command_line.h"

namespace megatron::hf_bridge {
namespace {

// Fields that do not change what the model computes from token ids: accepted with any value.
const std::set<std::string> kNoEffect = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "_name_or_path", "tie_word_embeddings", "pretraining_tp", "id2label", "label2id", "problem_type",
    "task_specific_params", "chunk_size_feed_forward", "is_encoder_decoder", "tokenizer_class",
    // GPT-2: the sequence-summary head of GPT2DoubleHeadsModel, and a precision detail of fp16 runs
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "reorder_and_upcast_attn", "n_ctx"};

// Shortest decimal text that reads back as the same float ("1e-05", not "9.99999974737875e-06").
std::string float_text(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), float(value));
  return std::string(buffer, result.ptr);
}

// config.json read field by field; every field read is marked, and unread() lists the rest.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
    MEGATRON_CHECK(j_.is_object(), where_ << " is not a JSON object");
  }
  bool present(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  const nlohmann::json& get(const std::string& key) {
    static const nlohmann::json absent;
    read_.insert(key);
    return j_.contains(key) ? j_.at(key) : absent;
  }
  void mark(const std::string& key) { read_.insert(key); }  // read where its value does not matter
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) {
    read_.insert(key);
    if (!present(key)) {
      MEGATRON_CHECK(fallback.has_value(), where_ << " has no \"" << key << "\": the model's shape needs it");
      return *fallback;
    }
    MEGATRON_CHECK(j_[key].is_number_integer() && j_[key].get<int64_t>() > 0,
                   where_ << ": \"" << key << "\" is " << j_[key].dump() << ", not a positive integer");
    return j_[key].get<int64_t>();
  }
  double number(const std::string& key, double fallback) {
    read_.insert(key);
    if (!present(key)) return fallback;
    MEGATRON_CHECK(j_[key].is_number(), where_ << ": \"" << key << "\" is " << j_[key].dump() << ", not a number");
    return j_[key].get<double>();
  }
  // A field we support only with one value (its default when absent).
  void require(const std::string& key, const nlohmann::json& supported, const std::string& why) {
    read_.insert(key);
    if (!j_.contains(key) || j_[key] == supported) return;
    MEGATRON_FAIL(where_ << ": \"" << key << "\" is " << j_[key].dump() << ", but only " << supported.dump()
                         << " can be imported: " << why);
  }
  void fail_on_unread() const {
    std::vector<std::string> unknown;
    for (const auto& [key, value] : j_.items())
      if (!read_.count(key) && !kNoEffect.count(key)) unknown.push_back(key + " = " + value.dump());
    MEGATRON_CHECK(unknown.empty(), where_ << " has field(s) we do not map: " << flags::join(unknown, ", ")
                                           << ". The model they describe may compute differently from the one we "
                                           << "would build; remove them only if they do not change the model");
  }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> read_;
};

using Flags = std::vector<std::pair<std::string, std::string>>;

// rope_theta and the scaling (Llama-3's, or linear: position interpolation), from the v4 fields or
// the v5 rope_parameters.
void read_rope(Fields& f, Flags& flags) {
  nlohmann::json rope = nlohmann::json::object();
  if (f.present("rope_parameters")) rope = f.get("rope_parameters");
  if (f.present("rope_scaling")) rope.update(f.get("rope_scaling"));
  f.mark("rope_parameters");
  f.mark("rope_scaling");
  const double theta = rope.contains("rope_theta") ? rope["rope_theta"].get<double>() : f.number("rope_theta", 10000.0);
  f.mark("rope_theta");
  flags.emplace_back("--rotary-base", float_text(theta));
  const std::string type = rope.contains("rope_type") ? rope["rope_type"].get<std::string>()
                           : rope.contains("type")    ? rope["type"].get<std::string>()
                                                      : "default";
  if (type == "default") return;
  MEGATRON_CHECK(type == "llama3" || type == "linear",
                 f.where() << ": rope_type \"" << type << "\" cannot be imported; we build the default RoPE, "
                           << "Llama-3's scaling (rope_type llama3) and position interpolation (rope_type linear)");
  MEGATRON_CHECK(rope.contains("factor") && rope["factor"].is_number(),
                 f.where() << ": " << type << " rope scaling without a numeric \"factor\"");
  if (type == "linear") {
    // Megatron's --rotary-seq-len-interpolation-factor is an integer.
    const double factor = rope["factor"].get<double>();
    MEGATRON_CHECK(factor >= 1.0 && factor == std::floor(factor),
                   f.where() << ": linear rope scaling with factor " << rope["factor"].dump()
                             << " cannot be imported: Megatron's --rotary-seq-len-interpolation-factor takes a whole "
                             << "number >= 1");
    flags.emplace_back("--rotary-seq-len-interpolation-factor", std::to_string(int64_t(factor)));
    return;
  }
  // Megatron-Core fixes these three; another value would give other frequencies.
  const std::pair<const char*, double> fixed[] = {
      {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
  for (const auto& [key, value] : fixed) {
    MEGATRON_CHECK(rope.contains(key) && rope[key].get<double>() == value,
                   f.where() << ": llama3 rope scaling with " << key << " = "
                             << (rope.contains(key) ? rope[key].dump() : "(absent)") << " cannot be imported; "
                             << "Megatron's --use-rope-scaling fixes it to " << value);
  }
  flags.emplace_back("--use-rope-scaling", "true");
  flags.emplace_back("--rope-scaling-factor", float_text(rope["factor"].get<double>()));
}

// Qwen2-MoE's and Qwen3-MoE's MLPs: layer i holds the sparse block unless mlp_only_layers lists it
// or i + 1 is no multiple of decoder_sparse_step (transformers' decoder layers), a dense MLP of
// intermediate_size otherwise: --moe-layer-freq as a list where some layer is dense. The router is
// a softmax over all experts and its top k, renormalised with norm_topk_prob (Megatron's default
// router), as they are without it (--moe-router-pre-softmax). Qwen2-MoE's block adds a shared
// expert, its output scaled by sigmoid(shared_expert_gate(x)): --moe-shared-expert-gate.
void read_qwen_moe_layers(Fields& f, Family family, Flags& flags) {
  const int64_t layers = f.integer("num_hidden_layers"), step = f.integer("decoder_sparse_step", 1);
  std::set<int64_t> dense;
  if (f.present("mlp_only_layers")) {
    const nlohmann::json& listed = f.get("mlp_only_layers");
    MEGATRON_CHECK(listed.is_array(), f.where() << ": \"mlp_only_layers\" is " << listed.dump() << ", not a list");
    for (const nlohmann::json& i : listed) {
      MEGATRON_CHECK(
          i.is_number_integer() && i.get<int64_t>() >= 0 && i.get<int64_t>() < layers,
          f.where() << ": \"mlp_only_layers\" holds " << i.dump() << ", not a layer index in [0, " << layers << ")");
      dense.insert(i.get<int64_t>());
    }
  }
  f.mark("mlp_only_layers");
  std::string pattern;
  bool every_layer = true;
  for (int64_t i = 0; i < layers; ++i) {
    const bool moe = !dense.count(i) && (i + 1) % step == 0;
    every_layer = every_layer && moe;
    pattern += std::string(i == 0 ? "[" : ",") + (moe ? "1" : "0");
  }
  // Absent, the config classes' defaults (Qwen2MoeConfig's, Qwen3MoeConfig's). transformers v5
  // saves Qwen3-MoE's expert count as num_local_experts (its attribute_map's name), v4 as num_experts.
  const bool qwen2 = family == Family::qwen2_moe;
  int64_t experts = f.integer("num_experts", qwen2 ? 60 : 128);
  if (!qwen2 && f.present("num_local_experts")) {
    const int64_t local = f.integer("num_local_experts");
    MEGATRON_CHECK(!f.present("num_experts") || experts == local, f.where() << ": \"num_experts\" " << experts
                                                                            << " and \"num_local_experts\" " << local
                                                                            << " disagree; they name the same count");
    experts = local;
  }
  flags.insert(flags.end(),
               {{"--num-experts", std::to_string(experts)},
                {"--moe-router-topk", std::to_string(f.integer("num_experts_per_tok", qwen2 ? 4 : 8))},
                {"--moe-ffn-hidden-size", std::to_string(f.integer("moe_intermediate_size", qwen2 ? 1408 : 768))},
                {"--moe-layer-freq", every_layer ? "1" : pattern + "]"}});
  if (qwen2)
    flags.insert(flags.end(), {{"--moe-shared-expert-intermediate-size",
                                std::to_string(f.integer("shared_expert_intermediate_size", 5632))},
                               {"--moe-shared-expert-gate", "true"}});
  const nlohmann::json& renormalised = f.get("norm_topk_prob");
  MEGATRON_CHECK(renormalised.is_null() || renormalised.is_boolean(),
                 f.where() << ": \"norm_topk_prob\" is " << renormalised.dump() << ", not true or false");
  if (renormalised != true) flags.emplace_back("--moe-router-pre-softmax", "true");  // both classes' default
  f.mark("router_aux_loss_coef");  // a training loss's weight (transformers': with output_router_logits)
  f.mark("output_router_logits");  // likewise
}

void read_llama_like(Fields& f, Family family, Flags& flags, int64_t& vocab_rows) {
  const int64_t hidden = f.integer("hidden_size"), heads = f.integer("num_attention_heads");
  // Absent, transformers' class defaults: 8 for Mistral and Mixtral, 32 for Qwen3, 4 for Qwen3-MoE,
  // 16 for Qwen2-MoE, the heads elsewhere.
  const int64_t groups = f.integer("num_key_value_heads", family == Family::mistral || family == Family::mixtral ? 8
                                                          : family == Family::qwen3                              ? 32
                                                          : family == Family::qwen3_moe                          ? 4
                                                          : family == Family::qwen2_moe                          ? 16
                                                                                        : heads);
  const int64_t positions = f.integer("max_position_embeddings");
  vocab_rows = f.integer("vocab_size");
  flags.insert(flags.end(), {{"--num-layers", std::to_string(f.integer("num_hidden_layers"))},
                             {"--hidden-size", std::to_string(hidden)},
                             {"--ffn-hidden-size", std::to_string(f.integer("intermediate_size"))},
                             {"--num-attention-heads", std::to_string(heads)},
                             {"--max-position-embeddings", std::to_string(positions)},
                             {"--seq-length", std::to_string(std::min<int64_t>(positions, 4096))},
                             {"--normalization", "RMSNorm"},
                             {"--norm-epsilon", float_text(f.number("rms_norm_eps", 1e-6))},
                             {"--swiglu", "true"},
                             {"--position-embedding-type", "rope"},
                             {"--disable-bias-linear", "true"},
                             {"--attention-dropout", float_text(f.number("attention_dropout", 0.0))},
                             {"--hidden-dropout", "0"}});
  if (groups != heads)
    flags.insert(flags.end(), {{"--group-query-attention", "true"}, {"--num-query-groups", std::to_string(groups)}});
  // head_dim when absent (or null): 128 for Qwen3 (Qwen3Config's), hidden_size / heads elsewhere,
  // which is Megatron's default too: --kv-channels only where the width differs from it, so that
  // configs written with and without the field read as the same model.
  const int64_t head_dim = f.present("head_dim") ? f.integer("head_dim") : family == Family::qwen3 ? 128 : 0;
  f.mark("head_dim");
  if (head_dim > 0 && head_dim * heads != hidden) flags.emplace_back("--kv-channels", std::to_string(head_dim));
  read_rope(f, flags);
  f.require("hidden_act", "silu", "the MLP is SwiGLU (--swiglu), gated by SiLU");
  if (family == Family::llama || family == Family::qwen3 || family == Family::qwen3_moe)
    f.require("attention_bias", false, "Megatron's --add-qkv-bias has no o_proj bias");
  if (family == Family::mixtral) {
    // Every layer's MLP is E SwiGLU experts of intermediate_size, each token routed to the top k of
    // a softmax over them, renormalised: Megatron's softmax over the top k logits.
    flags.insert(flags.end(), {{"--num-experts", std::to_string(f.integer("num_local_experts", 8))},
                               {"--moe-router-topk", std::to_string(f.integer("num_experts_per_tok", 2))}});
    f.require("router_jitter_noise", 0.0, "we do not jitter the router's input in training");
    f.mark("router_aux_loss_coef");  // a training loss's weight (transformers': with output_router_logits)
    f.mark("output_router_logits");  // likewise
  }
  if (family == Family::qwen2_moe || family == Family::qwen3_moe) read_qwen_moe_layers(f, family, flags);
  if (family == Family::qwen2_moe) {
    const nlohmann::json& bias = f.get("qkv_bias");  // Qwen2MoeConfig's default: true
    MEGATRON_CHECK(bias.is_null() || bias.is_boolean(),
                   f.where() << ": \"qkv_bias\" is " << bias.dump() << ", not true or false");
    if (bias != false) flags.emplace_back("--add-qkv-bias", "true");
  }
  if (family == Family::llama) f.require("mlp_bias", false, "we build the MLP without biases");
  if (family == Family::qwen2) flags.emplace_back("--add-qkv-bias", "true");
  if (family == Family::qwen3 || family == Family::qwen3_moe)
    flags.emplace_back("--qk-layernorm", "true");  // q_norm and k_norm over head_dim
  const bool qwen =
      family == Family::qwen2 || family == Family::qwen3 || family == Family::qwen2_moe || family == Family::qwen3_moe;
  const bool sliding = family == Family::mistral || family == Family::mixtral ||
                       (qwen && f.present("use_sliding_window") && f.get("use_sliding_window") == true);
  f.mark("use_sliding_window");
  if (qwen) {
    f.require("use_sliding_window", false, "Qwen's sliding window covers only some layers, which we do not build");
    f.mark("sliding_window");     // unused without use_sliding_window
    f.mark("max_window_layers");  // likewise
  }
  if (sliding && f.present("sliding_window")) {
    // transformers' window of W keys is the query and the W - 1 before it: Megatron's (W - 1, 0).
    flags.emplace_back("--window-size", std::to_string(f.integer("sliding_window") - 1) + ",0");
  }
  f.mark("sliding_window");
  if (f.present("layer_types")) {
    const std::string every = sliding && f.present("sliding_window") ? "sliding_attention" : "full_attention";
    for (const auto& t : f.get("layer_types"))
      MEGATRON_CHECK(t == every, f.where() << ": layer_types holds " << t.dump() << " but this model's layers are all "
                                           << every << "; models that mix layer types cannot be imported");
  }
  f.mark("layer_types");
  const bool tied = f.present("tie_word_embeddings") && f.get("tie_word_embeddings") == true;
  if (!tied) flags.emplace_back("--untie-embeddings-and-output-weights", "true");
}

void read_gpt2(Fields& f, Flags& flags, int64_t& vocab_rows) {
  const int64_t hidden = f.integer("n_embd", 768), positions = f.integer("n_positions", 1024);
  vocab_rows = f.integer("vocab_size", 50257);
  const int64_t ffn = f.present("n_inner") ? f.integer("n_inner") : 4 * hidden;
  f.mark("n_inner");
  const double resid = f.number("resid_pdrop", 0.1), embd = f.number("embd_pdrop", 0.1);
  MEGATRON_CHECK(resid == embd, f.where() << ": embd_pdrop " << embd << " differs from resid_pdrop " << resid
                                          << "; Megatron drops the embeddings with --hidden-dropout too, so they must "
                                          << "be equal");
  flags.insert(flags.end(), {{"--num-layers", std::to_string(f.integer("n_layer", 12))},
                             {"--hidden-size", std::to_string(hidden)},
                             {"--ffn-hidden-size", std::to_string(ffn)},
                             {"--num-attention-heads", std::to_string(f.integer("n_head", 12))},
                             {"--max-position-embeddings", std::to_string(positions)},
                             {"--seq-length", std::to_string(positions)},
                             {"--normalization", "LayerNorm"},
                             {"--norm-epsilon", float_text(f.number("layer_norm_epsilon", 1e-5))},
                             {"--position-embedding-type", "learned_absolute"},
                             {"--attention-dropout", float_text(f.number("attn_pdrop", 0.1))},
                             {"--hidden-dropout", float_text(resid)}});
  const std::string act =
      f.present("activation_function") ? f.get("activation_function").get<std::string>() : "gelu_new";
  f.mark("activation_function");
  MEGATRON_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                 f.where() << ": activation_function \"" << act << "\" cannot be imported; our GELU is the tanh "
                           << "approximation (gelu_new)");
  f.require("scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head dim)");
  f.require("scale_attn_by_inverse_layer_idx", false, "we do not scale attention by layer");
  f.require("add_cross_attention", false, "a decoder-only model has no cross-attention");
  f.require("tie_word_embeddings", true, "GPT-2's output layer is the word embedding");
}

nlohmann::json json_float(double value) { return nlohmann::json::parse(float_text(value)); }

}  // namespace

HfModelConfig read_hf_config(const nlohmann::json& config, const std::string& where) {
  Fields f(config, where);
  MEGATRON_CHECK(f.present("model_type"), where << " has no \"model_type\": it does not describe a transformers model");
  const std::string model_type = f.get("model_type").get<std::string>();
  const std::optional<Family> family = family_of_model_type(model_type);
  if (!family) {
    std::string supported;
    for (const FamilyInfo& info : families())
      supported += (supported.empty() ? "" : ", ") + std::string(info.model_type);
    MEGATRON_FAIL(where << ": model_type \"" << model_type << "\" is not a family we import (we import " << supported
                        << ")");
  }
  if (f.present("architectures")) {
    const std::string expected = family_info(*family).architecture;
    const nlohmann::json& archs = f.get("architectures");
    MEGATRON_CHECK(archs.is_array() && archs.size() == 1 && archs[0] == expected,
                   where << ": architectures " << archs.dump() << " is not [\"" << expected << "\"]; we import the "
                         << "causal language model of each family only");
  }
  HfModelConfig out;
  out.family = *family;
  try {
    if (*family == Family::gpt2)
      read_gpt2(f, out.model_flags, out.vocab_rows);
    else
      read_llama_like(f, *family, out.model_flags, out.vocab_rows);
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL(where << ": a field has a value of the wrong kind (" << e.what() << ")");
  }
  f.fail_on_unread();
  return out;
}

nlohmann::json hf_config_json(Family family, const TransformerConfig& c, int64_t vocab_rows, DType dtype,
                              const SpecialIds& ids) {
  const FamilyInfo& info = family_info(family);
  nlohmann::json j = {{"architectures", {info.architecture}},
                      {"model_type", info.model_type},
                      {"vocab_size", vocab_rows},
                      {"bos_token_id", ids.bos},
                      {"eos_token_id", ids.eos},
                      {"torch_dtype", dtype == DType::bf16  ? "bfloat16"
                                      : dtype == DType::f16 ? "float16"
                                                            : "float32"}};
  if (family == Family::gpt2) {
    j.update({{"n_embd", c.hidden_size},
              {"n_layer", c.num_layers},
              {"n_head", c.num_attention_heads},
              {"n_inner", c.ffn_hidden_size},
              {"n_positions", c.max_position_embeddings},
              {"layer_norm_epsilon", json_float(c.layernorm_epsilon)},
              {"activation_function", "gelu_new"},
              {"resid_pdrop", json_float(c.hidden_dropout)},
              {"embd_pdrop", json_float(c.hidden_dropout)},
              {"attn_pdrop", json_float(c.attention_dropout)},
              {"scale_attn_weights", true},
              {"tie_word_embeddings", true}});
    return j;
  }
  j.update({{"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_hidden_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_query_groups},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", json_float(c.layernorm_epsilon)},
            {"hidden_act", "silu"},
            {"rope_theta", json_float(c.rotary_base)},
            {"attention_dropout", json_float(c.attention_dropout)},
            {"tie_word_embeddings", !c.untie_embeddings_and_output_weights}});
  MEGATRON_CHECK(!(c.use_rope_scaling && c.rotary_seq_len_interpolation_factor),
                 "--use-rope-scaling with --rotary-seq-len-interpolation-factor: Hugging Face's config.json holds "
                 "one RoPE scaling, so this model cannot be exported");
  if (c.rotary_seq_len_interpolation_factor)
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", double(*c.rotary_seq_len_interpolation_factor)}};
  if (c.use_rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", json_float(c.rope_scaling_factor)},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  // Qwen2 has no head_dim field: its heads are hidden_size / num_attention_heads wide.
  const bool qwen2 = family == Family::qwen2 || family == Family::qwen2_moe;
  if (!qwen2) j["head_dim"] = c.kv_channels;
  MEGATRON_CHECK(!qwen2 || c.kv_channels * c.num_attention_heads == c.hidden_size,
                 "--kv-channels " << c.kv_channels << " x " << c.num_attention_heads << " heads differs from "
                                  << "--hidden-size " << c.hidden_size << ", which Qwen2's config.json cannot express");
  if (family == Family::llama) j.update({{"attention_bias", false}, {"mlp_bias", false}});
  if (family == Family::mistral) j["sliding_window"] = c.window_size_left + 1;
  if (qwen2 || family == Family::qwen3 || family == Family::qwen3_moe)
    j.update({{"use_sliding_window", false}, {"max_window_layers", c.num_layers}});
  if (family == Family::qwen3 || family == Family::qwen3_moe) j["attention_bias"] = false;
  if (family == Family::qwen2_moe)
    j.update(
        {{"qkv_bias", c.add_qkv_bias}, {"shared_expert_intermediate_size", c.moe.moe_shared_expert_intermediate_size}});
  if (family == Family::qwen2_moe || family == Family::qwen3_moe) {
    std::string why;
    const std::vector<bool> pattern = moe_layer_pattern(c.moe.moe_layer_freq, c.num_layers, &why);
    MEGATRON_CHECK(why.empty(), "--moe-layer-freq " << c.moe.moe_layer_freq << ": " << why);
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t i = 0; i < c.num_layers; ++i)
      if (!pattern[size_t(i)]) dense.push_back(i);
    j.update({{"num_experts", c.moe.num_moe_experts},
              {"num_experts_per_tok", c.moe.moe_router_topk},
              {"moe_intermediate_size", c.moe.moe_ffn_hidden_size},
              {"decoder_sparse_step", 1},
              {"mlp_only_layers", dense},
              {"norm_topk_prob", !c.moe.moe_router_pre_softmax},
              {"router_aux_loss_coef", json_float(c.moe.moe_aux_loss_coeff)},
              {"output_router_logits", false}});
  }
  if (family == Family::mixtral) {
    j.update({{"num_local_experts", c.moe.num_moe_experts},
              {"num_experts_per_tok", c.moe.moe_router_topk},
              {"router_aux_loss_coef", json_float(c.moe.moe_aux_loss_coeff)},
              {"output_router_logits", false},
              {"router_jitter_noise", 0.0}});
    j["sliding_window"] = c.window_size_left >= 0 ? nlohmann::json(c.window_size_left + 1) : nlohmann::json();
  }
  return j;
}

nlohmann::json hf_generation_config_json(const SpecialIds& ids) {
  return {{"bos_token_id", ids.bos}, {"eos_token_id", ids.eos}, {"do_sample", false}};
}

}  // namespace megatron::hf_bridge
