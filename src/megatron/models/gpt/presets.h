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
// llama: RMSNorm, SwiGLU, RoPE, untied embeddings, no biases, GQA, no dropout.
enum class ModelFamily { gpt2, llama };

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
