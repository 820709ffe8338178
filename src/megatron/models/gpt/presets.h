#pragma once
// Named model shapes for --model-preset: one table, shared by training, benchmarks and tests.
// A preset sets model fields only (and seq_length / max_position_embeddings); the vocabulary
// comes from the tokenizer, and anything a preset leaves at 0 is derived like any other config.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "megatron/transformer/transformer_config.h"

namespace megatron {

// gpt2: LayerNorm, GELU, learned absolute positions, tied embeddings, biases, dropout 0.1.
// llama: RMSNorm, SwiGLU, RoPE, untied embeddings, no biases, GQA, no dropout; the MoE presets
// are llama-style with experts in every layer.
enum class ModelFamily { gpt2, llama };

// The mixture-of-experts part of a preset; experts 0: a dense model.
struct MoEPresetShape {
  int64_t experts = 0;
  int64_t topk = 0;
  int64_t expert_ffn = 0;
  int64_t shared_expert_ffn = 0;  // 0: no shared expert
  // DeepSeek-style: sigmoid scores, the aux-loss-free expert bias, group-limited routing and a
  // scaling factor; otherwise Mixtral-style softmax over the top-k with an aux loss of 1e-2.
  bool deepseek_routing = false;
  int64_t groups = 0, group_topk = 0;
};

struct ModelPreset {
  std::string_view name;
  ModelFamily family;
  int64_t num_layers;
  int64_t hidden_size;
  int64_t num_attention_heads;
  int64_t num_query_groups;  // llama only (GQA); gpt2 uses multi-head attention
  int64_t ffn_hidden_size;   // 0: derived (4h for gpt2)
  int64_t seq_length;
  int64_t max_position_embeddings;  // 0: derived (= seq_length); RoPE models have no position table
  float rotary_base;                // llama only
  MoEPresetShape moe = {};
};

// All presets, in the order help text lists them.
std::span<const ModelPreset> model_presets();

// The preset called `name`, or nullptr.
const ModelPreset* find_model_preset(std::string_view name);

// The names joined as "tiny, gpt2-124m, ..." (for help and error messages).
std::string model_preset_names();

// Overwrites the model fields the preset defines; every other field keeps its value.
void apply_model_preset(const ModelPreset& preset, TransformerConfig& config);

}  // namespace megatron
