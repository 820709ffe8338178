#pragma once
// The Hugging Face model families we import and export, and how each is told apart: by
// config.json's model_type on import, and by the model's own features on export (a model trained
// here from scratch exports as the family whose architecture it has).
#include <optional>
#include <string>
#include <vector>

#include "megatron/transformer/transformer_config.h"

namespace megatron::hf_bridge {

enum class Family { llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gpt2 };

struct FamilyInfo {
  Family family;
  const char* model_type;    // config.json "model_type"
  const char* architecture;  // config.json "architectures"[0], the AutoModelForCausalLM class
};
const std::vector<FamilyInfo>& families();
const FamilyInfo& family_info(Family family);
std::optional<Family> family_of_model_type(const std::string& model_type);

// The family a model of `config` exports as: GPT-2 (LayerNorm, GELU, learned positions, biases,
// tied), Qwen3-MoE (MoE layers with q/k norms), Qwen2-MoE (MoE layers with a gated shared
// expert), Mixtral (MoE layers in every layer: softmax top-k routing over SwiGLU experts), Mistral
// (a sliding window), Qwen2 (QKV bias), Qwen3 (q/k norms), LLaMA (RMSNorm, SwiGLU, RoPE, no biases).
// Throws, naming the feature, for a model none of them describes.
Family family_of_model(const TransformerConfig& config);

}  // namespace megatron::hf_bridge
