#include "megatron/models/gpt/presets.h"

#include <array>

namespace megatron {
namespace {

// Shapes of the llama-* rows are the benchmark presets of the design (§12); gpt2-* are the
// published GPT-2 sizes. llama-tiny's ffn 176 is 8h/3 = 170.7 rounded up to a multiple of 16,
// so bf16 rows stay 32-byte aligned while keeping LLaMA's ffn/hidden ratio.
// clang-format off
constexpr std::array<ModelPreset, 13> kPresets{{
    // name        family              layers hidden heads groups ffn    seq   max_pos rope base
    {"tiny",       ModelFamily::gpt2,  2,     64,    4,    0,     0,     128,  128,    0.0f},
    {"gpt2-124m",  ModelFamily::gpt2,  12,    768,   12,   0,     0,     1024, 1024,   0.0f},
    {"gpt2-350m",  ModelFamily::gpt2,  24,    1024,  16,   0,     0,     1024, 1024,   0.0f},
    {"gpt2-774m",  ModelFamily::gpt2,  36,    1280,  20,   0,     0,     1024, 1024,   0.0f},
    {"gpt2-1.5b",  ModelFamily::gpt2,  48,    1600,  25,   0,     0,     1024, 1024,   0.0f},
    {"llama-tiny", ModelFamily::llama, 2,     64,    4,    2,     176,   128,  0,      10000.0f},
    {"llama-1b",   ModelFamily::llama, 16,    2048,  32,   8,     5632,  2048, 0,      10000.0f},
    {"llama-3b",   ModelFamily::llama, 26,    3072,  24,   8,     8192,  2048, 0,      10000.0f},
    {"llama-8b",   ModelFamily::llama, 32,    4096,  32,   8,     14336, 2048, 0,      500000.0f},
    // MoE: experts, top-k, expert ffn, shared-expert ffn, DeepSeek routing, groups, group top-k
    {"moe-tiny",   ModelFamily::llama, 2,     64,    4,    2,     176,   128,  0,      10000.0f,
     {4, 2, 64, 0, false, 0, 0}},
    {"deepseek-tiny", ModelFamily::llama, 2,  64,    4,    4,     176,   128,  0,      10000.0f,
     {16, 4, 32, 64, true, 4, 2}},
    // The one-GPU MoE benchmark: llama-1b attention, 8 experts of half its MLP width, top-2.
    {"moe-1b-8x",  ModelFamily::llama, 16,    2048,  32,   8,     5632,  2048, 0,      10000.0f,
     {8, 2, 2816, 0, false, 0, 0}},
    // Mixtral-8x7B's shape (vocabulary from the tokenizer: Mixtral's is 32000).
    {"mixtral-8x7b", ModelFamily::llama, 32,  4096,  32,   8,     14336, 4096, 0,      1000000.0f,
     {8, 2, 14336, 0, false, 0, 0}},
}};
// clang-format on

void apply_gpt2_style(TransformerConfig& config) {
  config.group_query_attention = false;
  config.num_query_groups = 0;
  config.normalization = Normalization::LayerNorm;
  config.swiglu = false;
  config.position_embedding_type = PositionEmbeddingType::learned_absolute;
  config.add_bias_linear = true;
  config.add_qkv_bias = false;
  config.untie_embeddings_and_output_weights = false;
  config.attention_dropout = 0.1f;
  config.hidden_dropout = 0.1f;
}

void apply_llama_style(const ModelPreset& preset, TransformerConfig& config) {
  config.group_query_attention = true;
  config.num_query_groups = preset.num_query_groups;
  config.normalization = Normalization::RMSNorm;
  config.swiglu = true;
  config.position_embedding_type = PositionEmbeddingType::rope;
  config.rotary_base = preset.rotary_base;
  config.add_bias_linear = false;
  config.add_qkv_bias = false;
  config.untie_embeddings_and_output_weights = true;
  // Megatron's LLaMA recipes train without dropout.
  config.attention_dropout = 0.0f;
  config.hidden_dropout = 0.0f;
}

void apply_moe(const MoEPresetShape& m, TransformerConfig& config) {
  MoEConfig& moe = config.moe;
  moe = MoEConfig{};
  if (m.experts == 0) return;
  moe.num_moe_experts = m.experts;
  moe.moe_router_topk = m.topk;
  moe.moe_ffn_hidden_size = m.expert_ffn;
  moe.moe_shared_expert_intermediate_size = m.shared_expert_ffn;
  if (!m.deepseek_routing) {
    moe.moe_aux_loss_coeff = 1e-2;  // Megatron's Mixtral recipe
    return;
  }
  // DeepSeek-V3's router: sigmoid, aux-loss-free bias, group-limited, scaled probabilities, and a
  // small per-sequence balance loss.
  moe.moe_router_score_function = RouterScoreFunction::sigmoid;
  moe.moe_router_enable_expert_bias = true;
  moe.moe_router_num_groups = m.groups;
  moe.moe_router_group_topk = m.group_topk;
  moe.moe_router_topk_scaling_factor = 2.5;
  moe.moe_router_load_balancing_type = LoadBalancingType::seq_aux_loss;
  moe.moe_aux_loss_coeff = 1e-4;
}

}  // namespace

std::span<const ModelPreset> model_presets() { return kPresets; }

const ModelPreset* find_model_preset(std::string_view name) {
  for (const ModelPreset& preset : kPresets) {
    if (preset.name == name) return &preset;
  }
  return nullptr;
}

std::string model_preset_names() {
  std::string names;
  for (const ModelPreset& preset : kPresets) {
    if (!names.empty()) names += ", ";
    names += preset.name;
  }
  return names;
}

void apply_model_preset(const ModelPreset& preset, TransformerConfig& config) {
  config.num_layers = preset.num_layers;
  config.hidden_size = preset.hidden_size;
  config.num_attention_heads = preset.num_attention_heads;
  config.ffn_hidden_size = preset.ffn_hidden_size;
  config.seq_length = preset.seq_length;
  config.max_position_embeddings = preset.max_position_embeddings;
  if (preset.family == ModelFamily::gpt2) {
    apply_gpt2_style(config);
  } else {
    apply_llama_style(preset, config);
  }
  apply_moe(preset.moe, config);
}

}  // namespace megatron
