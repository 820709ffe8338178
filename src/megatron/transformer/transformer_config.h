#pragma once
// The model's shape and numerics, with Megatron-Core's TransformerConfig names.
// A config is plain data: arguments.cpp fills it from flags/YAML/presets, derives the fields
// Megatron derives (ffn_hidden_size, kv_channels, ...) once, and validate() reports every
// inconsistency without rewriting anything. The parallel layout is not part of it: layers read
// it from their ParallelContext (parallel/parallel_args.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/transformer/fp8_config.h"
#include "megatron/transformer/moe/moe_config.h"
#include "megatron/transformer/recompute_config.h"

namespace megatron {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbeddingType { learned_absolute, rope, none };

struct TransformerConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // derived: 4h, or int((4h*2/3)/64)*64 with swiglu
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // derived: = heads unless group_query_attention
  int64_t kv_channels = 0;       // derived: hidden_size / num_attention_heads
  bool group_query_attention = false;
  int64_t vocab_size = 0;  // tokenizer vocabulary (before padding)
  // Rows that hold tokens when a converted model fixes them (HF's vocab_size, at least the
  // tokenizer's); the padding starts from it, so it is stored apart from the divisor. 0: vocab_size.
  int64_t true_vocab_size = 0;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t padded_vocab_size = 0;  // derived (§10.4 of the compat reference, times TP)
  int64_t max_position_embeddings = 0;
  int64_t seq_length = 0;
  Normalization normalization = Normalization::LayerNorm;
  float layernorm_epsilon = 1e-5f;  // flag: --norm-epsilon
  bool swiglu = false;              // false: GELU (tanh approximation)
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::learned_absolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  bool rotary_interleaved = false;
  bool use_rope_scaling = false;     // Llama-3.x frequency scaling (ops/rope.h)
  float rope_scaling_factor = 8.0f;  // its factor (Llama-3.1: 8, Llama-3.2: 32)
  // Position interpolation: RoPE angles of position p / factor (Hugging Face's linear scaling).
  std::optional<int64_t> rotary_seq_len_interpolation_factor;
  // Sliding-window attention, Megatron's --window-size "L,R": query i sees keys [i - L, i + R];
  // -1 is unlimited. Causal models take R = 0 (or -1, the same under the causal mask).
  int64_t window_size_left = -1;
  int64_t window_size_right = -1;
  bool add_bias_linear = true;  // flag: --disable-bias-linear clears it
  bool add_qkv_bias = false;    // bias on QKV only (Qwen2); implied by add_bias_linear
  // --qk-layernorm: each query and key head normalised over its head dim (the model's
  // normalization, one weight for all heads of q, one for k) before RoPE (Qwen3, OLMo-2).
  bool qk_layernorm = false;
  bool untie_embeddings_and_output_weights = false;
  float init_method_std = 0.02f;
  bool init_method_xavier_uniform = false;  // ParameterRegistry::initialize
  float attention_dropout = 0.1f;
  float hidden_dropout = 0.1f;
  DType params_dtype = DType::f32;  // --bf16 / --fp16; f64 only for CPU gradient checks
  // --deterministic-mode: the GPU ops whose sums land in a varying order (float atomics) take
  // fixed-order kernels instead, so a run repeats its bits (the CPU ops always do).
  bool deterministic_mode = false;
  MoEConfig moe;              // mixture of experts; off unless --num-experts
  RecomputeConfig recompute;  // activation recomputation; off unless --recompute-*
  Fp8Config fp8;              // FP8 GEMMs; off unless --fp8-format
};

// Fills the fields Megatron derives, where they are still 0: ffn_hidden_size (4h, or
// int((4h*2/3)/64)*64 with swiglu), kv_channels (h / heads, only when heads divide h),
// num_query_groups (heads, or Megatron's 1 with group_query_attention), max_position_embeddings
// (seq_length; Megatron requires the flag, we derive it for convenience) and padded_vocab_size
// (from vocab_size, padded for the run's TP). Never reports: validate() does that afterwards.
void derive_model_fields(TransformerConfig& config, int64_t tensor_model_parallel_size);

// Every rule the config breaks, one message each (value, rule, fix). Empty when valid.
std::vector<std::string> validate(const TransformerConfig& config);

// Megatron's rules for splitting the model over the layout's TP (and EP) ranks: whole attention
// heads, query groups, MLP columns, vocabulary rows and experts per rank, and under sequence
// parallelism (TP > 1) whole sequence shards. One message each; empty when the split works.
std::vector<std::string> validate_tensor_parallel_split(const TransformerConfig& config, const ParallelArgs& parallel);

// Megatron's vocab padding: ceil(vocab / (divisor * TP)) * (divisor * TP).
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel_size);

// Layers --moe-layer-freq makes MoE layers (0 for a dense model).
int64_t moe_layer_count(const TransformerConfig& config);

// Parameter count of the full (unsharded) model.
int64_t num_parameters(const TransformerConfig& config);

// Megatron's FLOPs per iteration for a global batch (reference §5.2; dense and MoE GPT path).
double num_floating_point_operations(const TransformerConfig& config, int64_t global_batch_size);

}  // namespace megatron
