#include "megatron/hf_bridge/hf_family.h"

#include <algorithm>

#include "megatron/core/error.h"

namespace megatron::hf_bridge {

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> table = {
      {Family::llama, "llama", "LlamaForCausalLM"},
      {Family::mistral, "mistral", "MistralForCausalLM"},
      {Family::qwen2, "qwen2", "Qwen2ForCausalLM"},
      {Family::qwen3, "qwen3", "Qwen3ForCausalLM"},
      {Family::mixtral, "mixtral", "MixtralForCausalLM"},
      {Family::qwen2_moe, "qwen2_moe", "Qwen2MoeForCausalLM"},
      {Family::qwen3_moe, "qwen3_moe", "Qwen3MoeForCausalLM"},
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
  // Llama-3's scaling or position interpolation: exported only where Llama-3's scaling is.
  const bool rope_scaled = c.use_rope_scaling || c.rotary_seq_len_interpolation_factor.has_value();
  const bool gpt2_like = c.normalization == Normalization::LayerNorm && !c.swiglu &&
                         c.position_embedding_type == PositionEmbeddingType::learned_absolute && c.add_bias_linear &&
                         !c.untie_embeddings_and_output_weights && c.window_size_left < 0 &&
                         c.num_query_groups == c.num_attention_heads && !rope_scaled && !c.qk_layernorm;
  if (gpt2_like) return Family::gpt2;
  const bool llama_like = c.normalization == Normalization::RMSNorm && c.swiglu &&
                          c.position_embedding_type == PositionEmbeddingType::rope && !c.add_bias_linear &&
                          !c.rotary_interleaved && c.rotary_percent == 1.0f;
  MEGATRON_CHECK(llama_like,
                 "this model has no Hugging Face family to export as: GPT-2 takes LayerNorm, GELU, learned absolute "
                 "positions, biases and a tied output layer (and no --qk-layernorm); LLaMA, Mistral, Qwen2 and Qwen3 "
                 "take RMSNorm, --swiglu, --position-embedding-type rope (halves rotated, --rotary-percent 1), "
                 "--disable-bias-linear");
  if (c.moe.enabled()) {
    // The MoE families route as Megatron's default softmax router does (a softmax over the top k
    // logits is the top k of a softmax over all experts, renormalised), dropless.
    const MoEConfig& m = c.moe;
    const bool plain_router = m.moe_router_score_function == RouterScoreFunction::softmax &&
                              !m.moe_router_topk_scaling_factor && m.moe_router_num_groups == 0 &&
                              !m.moe_router_enable_expert_bias && !m.moe_expert_capacity_factor;
    const bool shared = m.moe_shared_expert_intermediate_size > 0;
    if (c.qk_layernorm) {
      // Qwen3-MoE: dense layers where --moe-layer-freq has none (mlp_only_layers), the top k
      // renormalised or, with --moe-router-pre-softmax, not (norm_topk_prob).
      MEGATRON_CHECK(plain_router && !shared && !c.add_qkv_bias && c.window_size_left < 0,
                     "this MoE model with --qk-layernorm exports as Qwen3-MoE, which takes the softmax router "
                     "without top-k scaling, groups or expert bias, no shared expert, no capacity factor, and no "
                     "--add-qkv-bias or --window-size");
      return Family::qwen3_moe;
    }
    if (shared) {
      // Qwen2-MoE: as Qwen3-MoE's layers and router, beside a shared expert gated per token.
      MEGATRON_CHECK(plain_router && m.moe_shared_expert_gate && c.window_size_left < 0 && !rope_scaled,
                     "this MoE model with a shared expert exports as Qwen2-MoE, which takes the softmax router "
                     "without top-k scaling, groups or expert bias, no capacity factor, --moe-shared-expert-gate "
                     "(its shared expert is always gated), and no --window-size or RoPE scaling (--use-rope-scaling, "
                     "--rotary-seq-len-interpolation-factor)");
      return Family::qwen2_moe;
    }
    std::string why;
    const std::vector<bool> pattern = moe_layer_pattern(m.moe_layer_freq, c.num_layers, &why);
    const bool every_layer = why.empty() && std::all_of(pattern.begin(), pattern.end(), [](bool b) { return b; });
    MEGATRON_CHECK(every_layer && plain_router && !m.moe_router_pre_softmax && !c.add_qkv_bias && !rope_scaled &&
                       m.moe_ffn_hidden_size == c.ffn_hidden_size,
                   "this MoE model has no Hugging Face family to export as: Mixtral takes an MoE layer in every "
                   "layer (--moe-layer-freq 1), the softmax router without --moe-router-pre-softmax, top-k "
                   "scaling, groups or expert bias, no capacity factor, --moe-ffn-hidden-size equal to "
                   "--ffn-hidden-size, and no --add-qkv-bias or RoPE scaling; with --qk-layernorm the model "
                   "exports as Qwen3-MoE, with a gated shared expert as Qwen2-MoE, which both also take dense "
                   "layers, --moe-router-pre-softmax and their own --moe-ffn-hidden-size");
    return Family::mixtral;
  }
  if (c.qk_layernorm) {
    MEGATRON_CHECK(!c.add_qkv_bias && c.window_size_left < 0,
                   "a model with --qk-layernorm exports as Qwen3, whose exported config here has no QKV bias and no "
                   "sliding window; drop --add-qkv-bias / --window-size or --qk-layernorm");
    return Family::qwen3;
  }
  if (c.window_size_left >= 0) {
    MEGATRON_CHECK(!c.add_qkv_bias && !rope_scaled,
                   "a model with a sliding window exports as Mistral, which takes no QKV bias and no RoPE scaling "
                   "here; drop --add-qkv-bias / --use-rope-scaling / --rotary-seq-len-interpolation-factor or "
                   "--window-size");
    return Family::mistral;
  }
  if (c.add_qkv_bias) {
    MEGATRON_CHECK(!rope_scaled, "a model with a QKV bias exports as Qwen2, which takes no RoPE scaling here");
    return Family::qwen2;
  }
  return Family::llama;
}

}  // namespace megatron::hf_bridge
