#include "megatron/transformer/transformer_config.h"

#include <algorithm>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron {
namespace {

// The divisors of n nearest to `near` from below and from above, as "a or b" (for fixes).
std::string nearby_divisors(int64_t n, int64_t near) {
  int64_t below = 1;
  int64_t above = n;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (d <= near) {
      below = d;
    } else {
      above = d;
      break;
    }
  }
  return below == above ? concat(below) : concat(below, " or ", above);
}

void require_positive(std::vector<std::string>& errors, int64_t value, const char* flag, const char* fix) {
  if (value > 0) return;
  if (value == 0) {
    errors.push_back(concat(flag, " is required (got 0): ", fix));
  } else {
    errors.push_back(concat(flag, " ", value, " must be positive: ", fix));
  }
}

void check_shape(const TransformerConfig& c, std::vector<std::string>& errors) {
  require_positive(errors, c.num_layers, "--num-layers", "set e.g. --num-layers 12, or pick a --model-preset");
  require_positive(errors, c.hidden_size, "--hidden-size", "set e.g. --hidden-size 768, or pick a --model-preset");
  require_positive(errors, c.num_attention_heads, "--num-attention-heads",
                   "set e.g. --num-attention-heads 12, or pick a --model-preset");
  require_positive(errors, c.seq_length, "--seq-length", "set e.g. --seq-length 1024, or pick a --model-preset");
  if (c.hidden_size > 0 && c.ffn_hidden_size <= 0) {
    errors.push_back(concat("--ffn-hidden-size ", c.ffn_hidden_size,
                            " must be positive: leave it unset to derive 4*hidden_size, or give a width"));
  }
}

void check_heads(const TransformerConfig& c, std::vector<std::string>& errors) {
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0) return;  // already reported as required
  if (c.kv_channels < 0) {
    errors.push_back(concat("--kv-channels ", c.kv_channels, " must be positive: leave it unset to derive ",
                            "hidden_size / num_attention_heads"));
  } else if (c.kv_channels == 0 && c.hidden_size % c.num_attention_heads != 0) {
    errors.push_back(concat("--num-attention-heads ", c.num_attention_heads, " does not divide --hidden-size ",
                            c.hidden_size, ": hidden_size must be a multiple of num_attention_heads; choose e.g. ",
                            nearby_divisors(c.hidden_size, c.num_attention_heads), " heads, or set --kv-channels"));
  } else if (c.kv_channels == 0) {
    errors.push_back("--kv-channels 0 was never derived: call derive_model_fields() before validate(), or set it");
  }

  if (c.num_query_groups <= 0) {
    errors.push_back(concat("--num-query-groups ", c.num_query_groups, " must be positive: give the number of ",
                            "key/value heads with --group-query-attention (without it, it equals the heads)"));
  } else if (c.num_attention_heads % c.num_query_groups != 0) {
    errors.push_back(concat("--num-query-groups ", c.num_query_groups, " does not divide --num-attention-heads ",
                            c.num_attention_heads, ": every query group holds the same number of heads; choose e.g. ",
                            nearby_divisors(c.num_attention_heads, c.num_query_groups), " groups"));
  } else if (!c.group_query_attention && c.num_query_groups != c.num_attention_heads) {
    errors.push_back(concat("--num-query-groups ", c.num_query_groups, " differs from --num-attention-heads ",
                            c.num_attention_heads, " without --group-query-attention: Megatron would ignore it; ",
                            "add --group-query-attention or drop --num-query-groups"));
  }
}

void check_positions(const TransformerConfig& c, std::vector<std::string>& errors) {
  if (c.seq_length > 0 && c.max_position_embeddings <= 0) {
    errors.push_back(concat("--max-position-embeddings ", c.max_position_embeddings,
                            " must be positive: leave it unset to use --seq-length"));
  } else if (c.seq_length > c.max_position_embeddings && c.seq_length > 0) {
    errors.push_back(concat("--seq-length ", c.seq_length, " exceeds --max-position-embeddings ",
                            c.max_position_embeddings, ": positions past the table have no embedding; raise ",
                            "--max-position-embeddings to at least ", c.seq_length, " or shorten --seq-length"));
  }
  if (c.position_embedding_type != PositionEmbeddingType::rope) return;
  if (!(c.rotary_base > 0.0f)) {
    errors.push_back(concat("--rotary-base ", c.rotary_base, " must be positive: use e.g. 10000"));
  }
  if (!(c.rotary_percent > 0.0f && c.rotary_percent <= 1.0f)) {
    errors.push_back(concat("--rotary-percent ", c.rotary_percent,
                            " must lie in (0, 1]: it is the fraction of each head rotated; use e.g. 1.0"));
  } else if (c.kv_channels > 0) {
    const auto rotary_dim = int64_t(float(c.kv_channels) * c.rotary_percent);
    if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
      errors.push_back(concat("--rotary-percent ", c.rotary_percent, " gives rotary dim int(", c.kv_channels, " * ",
                              c.rotary_percent, ") = ", rotary_dim,
                              ": RoPE rotates pairs, so it must be even and positive; choose a percent that gives ",
                              "an even dim, e.g. 1.0 or 0.5"));
    }
  }
}

void check_rope_scaling_and_window(const TransformerConfig& c, std::vector<std::string>& errors) {
  if (c.use_rope_scaling && c.position_embedding_type != PositionEmbeddingType::rope) {
    errors.push_back(
        "--use-rope-scaling scales RoPE frequencies, but --position-embedding-type is not rope: add "
        "--position-embedding-type rope or drop --use-rope-scaling");
  }
  if (c.use_rope_scaling && !(c.rope_scaling_factor > 0.0f)) {
    errors.push_back(concat("--rope-scaling-factor ", c.rope_scaling_factor, " must be positive: use e.g. 8"));
  }
  if (const std::optional<int64_t> factor = c.rotary_seq_len_interpolation_factor) {
    if (c.position_embedding_type != PositionEmbeddingType::rope)
      errors.push_back(concat("--rotary-seq-len-interpolation-factor ", *factor,
                              " interpolates RoPE positions, but --position-embedding-type is not rope: add "
                              "--position-embedding-type rope or drop the factor"));
    if (*factor < 1)
      errors.push_back(concat("--rotary-seq-len-interpolation-factor ", *factor,
                              " must be >= 1: the context length over the one trained at, e.g. 4"));
  }
  if (c.window_size_left < -1) {
    errors.push_back(concat("--window-size ", c.window_size_left, ",", c.window_size_right,
                            ": the left size must be >= 0, or -1 for no window; use e.g. 4096,0"));
  }
  if (c.window_size_right != 0 && c.window_size_right != -1) {
    errors.push_back(concat("--window-size ", c.window_size_left, ",", c.window_size_right,
                            ": GPT models are causal, so no query sees keys after it; the right size must be 0 ",
                            "(or -1); use ", c.window_size_left, ",0"));
  }
}

void check_fraction(std::vector<std::string>& errors, float value, const char* flag) {
  if (value >= 0.0f && value < 1.0f) return;
  errors.push_back(concat(flag, " ", value, " must lie in [0, 1): it is a drop probability; use e.g. 0.1 or 0"));
}

void check_numerics(const TransformerConfig& c, std::vector<std::string>& errors) {
  check_fraction(errors, c.attention_dropout, "--attention-dropout");
  check_fraction(errors, c.hidden_dropout, "--hidden-dropout");
  if (!(c.layernorm_epsilon > 0.0f)) {
    errors.push_back(concat("--norm-epsilon ", c.layernorm_epsilon, " must be positive: use e.g. 1e-5"));
  }
  if (!(c.init_method_std > 0.0f)) {
    errors.push_back(concat("--init-method-std ", c.init_method_std, " must be positive: use e.g. 0.02"));
  }
  const DType d = c.params_dtype;
  if (d != DType::f32 && d != DType::bf16 && d != DType::f16 && d != DType::f64) {
    errors.push_back(concat("params dtype ", dtype_name(d), " cannot hold parameters: use f32 or --bf16"));
  }
}

void check_vocab(const TransformerConfig& c, std::vector<std::string>& errors) {
  require_positive(errors, c.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by", "use e.g. 128");
  if (c.vocab_size <= 0) {
    errors.push_back(concat("vocab size ", c.vocab_size, " must be positive: it comes from the tokenizer; set ",
                            "--tokenizer-type (and --vocab-size for NullTokenizer)"));
  } else if (c.true_vocab_size != 0 && c.true_vocab_size < c.vocab_size) {
    errors.push_back(concat("--true-vocab-size ", c.true_vocab_size, " is smaller than the tokenizer's ", c.vocab_size,
                            " tokens: every token needs an embedding row; use at least ", c.vocab_size,
                            " (or 0: the tokenizer's size)"));
  } else if (c.padded_vocab_size < c.vocab_size) {
    errors.push_back(concat("padded vocab size ", c.padded_vocab_size, " is smaller than the vocab size ", c.vocab_size,
                            ": every token needs an embedding row; leave it to derivation"));
  }
}

// The MoE layers on the layout: whole experts per EP rank, EP only with experts; under TP
// sequence parallelism, and each expert's FFN split over expert TP.
void check_expert_split(const MoEConfig& m, const ParallelArgs& parallel, std::vector<std::string>& errors) {
  const int64_t tp = parallel.tensor_model_parallel_size, ep = parallel.expert_model_parallel_size;
  const int64_t etp = parallel.expert_tensor_parallel_size > 0 ? parallel.expert_tensor_parallel_size : tp;
  if (!m.enabled()) {
    if (ep > 1)
      errors.push_back(concat("--expert-model-parallel-size ", ep,
                              " splits the experts of MoE layers, and this model has none (no --num-experts): "
                              "add --num-experts N, or drop the flag"));
    return;
  }
  if (ep > 0 && m.num_moe_experts % ep != 0)
    errors.push_back(concat("--num-experts ", m.num_moe_experts, " is not divisible by --expert-model-parallel-size ",
                            ep, ": each EP rank holds num_experts / EP whole experts; use an EP that divides ",
                            m.num_moe_experts));
  if (tp > 1 && !parallel.sequence_parallel)
    errors.push_back(concat("--num-experts with --tensor-model-parallel-size ", tp,
                            " needs --sequence-parallel (Megatron's rule: each TP rank routes its own tokens); add ",
                            "--sequence-parallel, or use TP 1"));
  if (etp > 1 && m.moe_ffn_hidden_size > 0 && m.moe_ffn_hidden_size % etp != 0)
    errors.push_back(concat("--moe-ffn-hidden-size ", m.moe_ffn_hidden_size, " is not divisible by the expert TP size ",
                            etp, " (--expert-tensor-parallel-size, default the TP size): each expert TP rank holds ",
                            "moe_ffn_hidden_size / expert TP columns of every expert; use a multiple of ", etp));
  if (tp > 1 && m.moe_shared_expert_intermediate_size % tp != 0)
    errors.push_back(concat("--moe-shared-expert-intermediate-size ", m.moe_shared_expert_intermediate_size,
                            " is not divisible by --tensor-model-parallel-size ", tp,
                            ": the shared expert is split over TP as the MLP; use a multiple of ", tp));
}

}  // namespace

void derive_model_fields(TransformerConfig& c, int64_t tensor_model_parallel_size) {
  if (c.ffn_hidden_size == 0) {
    // Megatron: int((4h * 2/3) / 64) * 64 in floating point, i.e. floor(8h / 192) * 64.
    c.ffn_hidden_size = c.swiglu ? (8 * c.hidden_size) / 192 * 64 : 4 * c.hidden_size;
  }
  if (c.kv_channels == 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0) {
    c.kv_channels = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_query_groups == 0) c.num_query_groups = c.group_query_attention ? 1 : c.num_attention_heads;
  if (c.max_position_embeddings == 0) c.max_position_embeddings = c.seq_length;
  derive_moe_fields(c.moe, c.ffn_hidden_size);
  const int64_t token_rows = c.true_vocab_size > 0 ? c.true_vocab_size : c.vocab_size;
  if (c.padded_vocab_size == 0 && token_rows > 0 && c.make_vocab_size_divisible_by > 0 &&
      tensor_model_parallel_size > 0) {
    c.padded_vocab_size = padded_vocab_size(token_rows, c.make_vocab_size_divisible_by, tensor_model_parallel_size);
  }
}

std::vector<std::string> validate(const TransformerConfig& config) {
  std::vector<std::string> errors;
  check_shape(config, errors);
  check_heads(config, errors);
  check_positions(config, errors);
  check_rope_scaling_and_window(config, errors);
  check_numerics(config, errors);
  check_vocab(config, errors);
  for (std::string& e : validate_moe(config.moe, config.num_layers, config.add_bias_linear))
    errors.push_back(std::move(e));
  return errors;
}

std::vector<std::string> validate_tensor_parallel_split(const TransformerConfig& c, const ParallelArgs& parallel) {
  std::vector<std::string> errors;
  const int64_t tp = parallel.tensor_model_parallel_size;
  if (tp <= 0) return errors;  // validate(ParallelArgs) names it
  if (c.num_attention_heads > 0 && c.num_attention_heads % tp != 0) {
    errors.push_back(concat(
        "--num-attention-heads ", c.num_attention_heads, " is not divisible by --tensor-model-parallel-size ", tp,
        ": each TP rank computes whole attention heads; use TP ", nearby_divisors(c.num_attention_heads, tp)));
  }
  if (c.num_query_groups > 0 && c.num_query_groups % tp != 0) {
    errors.push_back(concat("--num-query-groups ", c.num_query_groups,
                            " is not divisible by --tensor-model-parallel-size ", tp,
                            ": each TP rank holds whole query groups (key/value heads), so TP may not exceed ",
                            "them; use TP ", nearby_divisors(c.num_query_groups, tp), ", or more query groups"));
  }
  if (c.ffn_hidden_size > 0 && c.ffn_hidden_size % tp != 0) {
    errors.push_back(concat("--ffn-hidden-size ", c.ffn_hidden_size,
                            " is not divisible by --tensor-model-parallel-size ", tp,
                            ": each TP rank holds ffn_hidden_size / TP columns of the MLP; use a multiple of ", tp));
  }
  check_expert_split(c.moe, parallel, errors);
  // Derived padding always divides; a vocabulary padded for another TP (a checkpoint's) may not.
  if (c.padded_vocab_size > 0 && c.padded_vocab_size % tp != 0) {
    errors.push_back(concat("the padded vocabulary (", c.padded_vocab_size,
                            " rows) is not divisible by --tensor-model-parallel-size ", tp,
                            ": each TP rank holds padded_vocab_size / TP rows of the embedding and output layer; ",
                            "use a TP that divides ", c.padded_vocab_size));
  }
  if (parallel.sequence_parallel && tp > 1 && c.seq_length > 0 && c.seq_length % tp != 0) {
    errors.push_back(concat("--seq-length ", c.seq_length, " is not divisible by --tensor-model-parallel-size ", tp,
                            " under --sequence-parallel: each TP rank holds seq_length / TP positions of the ",
                            "sequence; use a multiple of ", tp, " or drop --sequence-parallel"));
  }
  return errors;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel_size) {
  MEGATRON_CHECK(vocab_size >= 0 && divisible_by > 0 && tensor_parallel_size > 0,
                 "padded_vocab_size(" << vocab_size << ", " << divisible_by << ", " << tensor_parallel_size
                                      << "): the vocab must be >= 0 and the divisor and TP positive");
  const int64_t multiple = divisible_by * tensor_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t moe_layer_count(const TransformerConfig& c) {
  if (!c.moe.enabled()) return 0;
  std::string why;
  const std::vector<bool> pattern = moe_layer_pattern(c.moe.moe_layer_freq, c.num_layers, &why);
  return int64_t(std::count(pattern.begin(), pattern.end(), true));
}

int64_t num_parameters(const TransformerConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_attention_heads * c.kv_channels;  // n*d
  const int64_t qkv_width = q_width + 2 * c.num_query_groups * c.kv_channels;
  const int64_t fc1_width = c.swiglu ? 2 * c.ffn_hidden_size : c.ffn_hidden_size;  // [gate; up]
  const int64_t norm = c.normalization == Normalization::LayerNorm ? 2 * h : h;    // LayerNorm has a bias
  const bool qkv_bias = c.add_bias_linear || c.add_qkv_bias;

  int64_t layer = 2 * norm;                                      // input + pre-MLP norm
  if (c.qk_layernorm) layer += 2 * norm / h * c.kv_channels;     // q and k norms over a head
  layer += h * qkv_width + (qkv_bias ? qkv_width : 0);           // linear_qkv
  layer += q_width * h + (c.add_bias_linear ? h : 0);            // linear_proj
  layer += h * fc1_width + (c.add_bias_linear ? fc1_width : 0);  // linear_fc1
  layer += c.ffn_hidden_size * h + (c.add_bias_linear ? h : 0);  // linear_fc2

  int64_t total = c.num_layers * layer + norm;  // + final norm
  if (c.moe.enabled()) {
    // An MoE layer holds the router, E experts and the shared expert (and its gate) in place of the MLP.
    const MoEConfig& m = c.moe;
    const int64_t gated = c.swiglu ? 3 : 2;
    const int64_t moe_mlp = m.num_moe_experts * h + m.num_moe_experts * gated * h * m.moe_ffn_hidden_size +
                            gated * h * m.moe_shared_expert_intermediate_size + (m.moe_shared_expert_gate ? h : 0);
    const int64_t dense_mlp = gated * h * c.ffn_hidden_size;
    total += moe_layer_count(c) * (moe_mlp - dense_mlp);
  }
  total += c.padded_vocab_size * h;  // word embeddings
  if (c.position_embedding_type == PositionEmbeddingType::learned_absolute) total += c.max_position_embeddings * h;
  if (c.untie_embeddings_and_output_weights) total += c.padded_vocab_size * h;  // output layer, no bias
  return total;
}

double num_floating_point_operations(const TransformerConfig& c, int64_t global_batch_size) {
  // Reference §5.2, dense path without MTP or an output gate. The factor 6 = 2 (multiply-add)
  // * 3 (forward, activation gradient, weight gradient).
  const double B = double(global_batch_size);
  const double s = double(c.seq_length);
  const double h = double(c.hidden_size);
  const double L = double(c.num_layers);
  const double V = double(c.padded_vocab_size);
  const double nd = double(c.num_attention_heads) * double(c.kv_channels);
  const double gd = double(c.num_query_groups) * double(c.kv_channels);
  const double e = c.swiglu ? 3.0 : 2.0;
  const double F = double(c.ffn_hidden_size);

  const double attn_proj = 6.0 * (h * (nd + 2.0 * gd) + nd * h);
  const double mlp = 6.0 * h * F * e;
  // MoE layers (reference §5.2): k experts of width F_e per token, plus the shared expert.
  const double L_moe = double(moe_layer_count(c));
  const double mlp_moe = 6.0 * h *
                         (double(c.moe.moe_ffn_hidden_size) * double(c.moe.moe_router_topk) * e +
                          double(c.moe.moe_shared_expert_intermediate_size) * e);
  const double logits = 6.0 * h * V;
  const double per_token = (L - L_moe) * mlp + L_moe * mlp_moe + L * attn_proj + logits;
  // Causal core attention counts half of the s x s score and context products.
  const double core_attention = B * s * s * L * 6.0 * nd;
  return B * s * per_token + core_attention;
}

}  // namespace megatron
