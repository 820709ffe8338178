// The tiny model shapes that whole-model tests share: GPT-2 style (LayerNorm, GELU, learned
// positions, tied, biases) and LLaMA style (RMSNorm, SwiGLU, RoPE, GQA, untied, no biases), each
// small enough for f64 finite differences. Tests change only what they are about.
#pragma once

#include "megatron/transformer/transformer_config.h"

namespace megatron::testing {

inline TransformerConfig gpt2_style(DType dtype) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 4;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.vocab_size = c.padded_vocab_size = 24;
  c.max_position_embeddings = c.seq_length = 6;
  c.init_method_std = 0.3f;  // large enough that every path carries a visible gradient
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.2f;
  c.params_dtype = dtype;
  return c;
}

inline TransformerConfig llama_style(DType dtype) {
  TransformerConfig c = gpt2_style(dtype);
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.position_embedding_type = PositionEmbeddingType::rope;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

}  // namespace megatron::testing
