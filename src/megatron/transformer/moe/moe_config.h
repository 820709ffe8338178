#pragma once
// The mixture-of-experts part of the model's shape, with Megatron-Core's TransformerConfig names
// (held by TransformerConfig::moe; the flags are Megatron's --num-experts, --moe-*). Plain data:
// derive_moe_fields fills what Megatron derives, validate_moe reports every broken rule.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron {

enum class RouterScoreFunction { softmax, sigmoid };
enum class LoadBalancingType { aux_loss, seq_aux_loss, none };
enum class TokenDropPolicy { probs, position };
enum class TokenDispatcherType { allgather, alltoall };

struct MoEConfig {
  int64_t num_moe_experts = 0;                      // --num-experts; 0: a dense model
  std::string moe_layer_freq = "1";                 // N (every N-th layer, from layer 0) or a list "[1,0]*2"
  int64_t moe_ffn_hidden_size = 0;                  // derived: ffn_hidden_size
  int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool moe_shared_expert_gate = false;              // the shared expert's output scaled by sigmoid(x . w)
  int64_t moe_router_topk = 2;
  RouterScoreFunction moe_router_score_function = RouterScoreFunction::softmax;
  bool moe_router_pre_softmax = false;  // softmax over all experts before top-k (else over the k)
  int64_t moe_router_num_groups = 0;    // group-limited routing; 0: off
  int64_t moe_router_group_topk = 0;    // groups chosen per token
  std::optional<double> moe_router_topk_scaling_factor;
  LoadBalancingType moe_router_load_balancing_type = LoadBalancingType::aux_loss;
  double moe_aux_loss_coeff = 0.0;
  std::optional<double> moe_z_loss_coeff;
  bool moe_router_enable_expert_bias = false;  // aux-loss-free balancing (sigmoid routing)
  double moe_router_bias_update_rate = 1e-3;
  // Megatron's benchmark aid: route on random N(0,1) logits (gradients pass straight through to the
  // router's), a balanced load whatever the model has learnt.
  bool moe_router_force_load_balancing = false;
  std::optional<double> moe_expert_capacity_factor;  // unset: dropless
  TokenDropPolicy moe_token_drop_policy = TokenDropPolicy::probs;
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_grouped_gemm = false;
  TokenDispatcherType moe_token_dispatcher_type = TokenDispatcherType::allgather;

  bool enabled() const { return num_moe_experts > 0; }
};

// Which of `num_layers` layers (0-based) are MoE layers under --moe-layer-freq: "N" makes layers
// 0, N, 2N, ... MoE; "[1,0,...]" lists one 0/1 per layer, and as in Megatron (which evaluates it
// as Python) lists may be joined by `+` and repeated by `*`, e.g. "([0]*3+[1]*58)". Empty, with
// *error set, when the value cannot be read or the list's length differs from num_layers.
std::vector<bool> moe_layer_pattern(const std::string& moe_layer_freq, int64_t num_layers, std::string* error);

// Fills moe_ffn_hidden_size (= ffn_hidden_size, Megatron's default) where it is still 0.
void derive_moe_fields(MoEConfig& moe, int64_t ffn_hidden_size);

// Every rule the MoE settings break (only when experts are enabled), one message each.
// `add_bias_linear`: the experts have no biases (Megatron's grouped experts neither).
std::vector<std::string> validate_moe(const MoEConfig& moe, int64_t num_layers, bool add_bias_linear);

}  // namespace megatron
