#include "megatron/hf_bridge/hf_family.h"

#include "megatron/core/error.h"

namespace megatron::hf_bridge {

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> table = {
      {Family::llama, "llama", "LlamaForCausalLM"},
      {Family::mistral, "mistral", "MistralForCausalLM"},
      {Family::qwen2, "qwen2", "Qwen2ForCausalLM"},
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
  MEGATRON_CHECK(!c.qk_layernorm,
                 "this model normalises its query and key heads (--qk-layernorm): none of the Hugging Face families "
                 "exported here (GPT-2, LLaMA, Mistral, Qwen2) has those norms, and Qwen3's is not built");
  const bool gpt2_like = c.normalization == Normalization::LayerNorm && !c.swiglu &&
                         c.position_embedding_type == PositionEmbeddingType::learned_absolute && c.add_bias_linear &&
                         !c.untie_embeddings_and_output_weights && c.window_size_left < 0 &&
                         c.num_query_groups == c.num_attention_heads && !c.use_rope_scaling;
  if (gpt2_like) return Family::gpt2;
  const bool llama_like = c.normalization == Normalization::RMSNorm && c.swiglu &&
                          c.position_embedding_type == PositionEmbeddingType::rope && !c.add_bias_linear &&
                          !c.rotary_interleaved && c.rotary_percent == 1.0f;
  MEGATRON_CHECK(llama_like,
                 "this model has no Hugging Face family to export as: GPT-2 takes LayerNorm, GELU, learned absolute "
                 "positions, biases and a tied output layer; LLaMA, Mistral and Qwen2 take RMSNorm, --swiglu, "
                 "--position-embedding-type rope (halves rotated, --rotary-percent 1), --disable-bias-linear");
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
