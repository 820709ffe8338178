#include "megatron/hf_bridge/hf_family.h"

#include "megatron/core/error.h"

namespace megatron::hf_bridge {

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> table = {
      {Family::llama, "llama", "LlamaForCausalLM"}, {Family::mistral, "mistral", "MistralForCausalLM"},
      {Family::qwen2, "qwen2", "Qwen2ForCausalLM"}, {Family::qwen3, "qwen3", "Qwen3ForCausalLM"},
      {Family::gpt2, "gpt2", "GPT2LMHeadModel"},
  };
  return table;
}

const FamilyInfo& family_info(Family family) {
  for (const FamilyInfo& info : families())
    if (info.family == family) return info;
  MEGATRON_FAIL("no FamilyInfo for family " << int(family));
}

std::optional<Family> family_of_model_type(const std::string& model_type) {
  for (const FamilyInfo& info : families())
    if (model_type == info.model_type) return info.family;
  return std::nullopt;
}

Family family_of_model(const TransformerConfig& c) {
  const bool gpt2_like = c.normalization == Normalization::LayerNorm && !c.swiglu &&
                         c.position_embedding_type == PositionEmbeddingType::learned_absolute && c.add_bias_linear &&
                         !c.untie_embeddings_and_output_weights && c.window_size_left < 0 &&
                         c.num_query_groups == c.num_attention_heads && !c.use_rope_scaling && !c.qk_layernorm;
  if (gpt2_like) return Family::gpt2;
  const bool llama_like = c.normalization == Normalization::RMSNorm && c.swiglu &&
                          c.position_embedding_type == PositionEmbeddingType::rope && !c.add_bias_linear &&
                          !c.rotary_interleaved && c.rotary_percent == 1.0f;
  MEGATRON_CHECK(llama_like,
                 "this model has no Hugging Face family to export as: GPT-2 takes LayerNorm, GELU, learned absolute "
                 "positions, biases and a tied output layer (and no --qk-layernorm); LLaMA, Mistral, Qwen2 and Qwen3 "
                 "take RMSNorm, --swiglu, --position-embedding-type rope (halves rotated, --rotary-percent 1), "
                 "--disable-bias-linear");
  if (c.qk_layernorm) {
    MEGATRON_CHECK(!c.add_qkv_bias && c.window_size_left < 0,
                   "a model with --qk-layernorm exports as Qwen3, whose exported config here has no QKV bias and no "
                   "sliding window; drop --add-qkv-bias / --window-size or --qk-layernorm");
    return Family::qwen3;
  }
  if (c.window_size_left >= 0) {
    MEGATRON_CHECK(!c.add_qkv_bias && !c.use_rope_scaling,
                   "a model with a sliding window exports as Mistral, which has no QKV bias and no Llama-3 RoPE "
                   "scaling; drop --add-qkv-bias / --use-rope-scaling or --window-size");
    return Family::mistral;
  }
  if (c.add_qkv_bias) {
    MEGATRON_CHECK(!c.use_rope_scaling, "a model with a QKV bias exports as Qwen2, which has no Llama-3 RoPE scaling");
    return Family::qwen2;
  }
  return Family::llama;
}

}  // namespace megatron::hf_bridge
