#pragma once
// Self-attention (Megatron-Core SelfAttention): fused QKV column-parallel projection in the
// per-query-group layout, the q/k norms (--qk-layernorm), RoPE, core (flash-style) attention,
// row-parallel output projection.
// Under TP each rank owns whole query groups: num_query_groups / TP of them, and its heads'
// global indices [head_offset, head_offset + heads_local) of total_heads feed the attention
// dropout's counters, so every TP layout draws the TP=1 masks. With sequence parallelism the
// input and output are sequence shards; attention itself sees the whole sequence (the QKV
// projection gathers it). Under context parallelism (a CP group of more than one rank) the
// sequence is this rank's two chunks of Megatron's load-balanced split
// (context_parallel/load_balance.h): q, k, v are split out of the projection, RoPE rotates each
// chunk by its true positions and the core attention is the ring over the CP group
// (context_parallel/ring_attention.h) or, with --cp-comm-type a2a, the all-to-all over heads
// (all_to_all_attention.h); both keep the op's contract, so Saved holds the same q, k, v, out, lse.
// Without CP the layer makes no copies: RoPE rotates the projection's query and key heads in place
// (ops::rope_forward_qkv), the attention op reads q, k, v from it (attention_forward_qkv; in place
// where the backend can, else it splits them itself), and backward rotates the fused gradient
// back in place. With --qk-layernorm q, k and v are split out as under CP: each query and key head
// is normalised over its head dim (Megatron's q_layernorm / k_layernorm: one weight for all query
// heads, one for all key heads) before RoPE, and the norms keep the heads they normalised.
// With --recompute-modules core_attn (selective recomputation) the attention op's output and
// log-sum-exp are not kept: backward runs the op again on the saved q, k, v before the output
// projection's backward, which reads the output. The op is deterministic, so the gradients are the
// same bits.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/rope.h"
#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/forward_context.h"
#include "megatron/transformer/norm.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron {

class SelfAttention {
 public:
  struct Saved {
    tensor_parallel::LinearSaved qkv, proj;
    Tensor q, k, v;              // under CP or --qk-layernorm (after RoPE): (S,B,NH_local,d), (S,B,G_local,d)
    Norm::Saved q_norm, k_norm;  // --qk-layernorm: the heads before their norms, and the statistics
    Tensor fused;     // without CP, instead of q, k, v: the projection (S,B,G_local,(NH/G+2)*d), after RoPE
    Tensor out, lse;  // empty when recomputed (core_attn)
    ops::AttentionParams attention;
    void count(ActivationMemory& m) const;
  };
  // fp8: linear_qkv's and linear_proj's GEMMs in FP8 with this recipe (transformer/fp8_config.h).
  SelfAttention(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                const std::string& prefix, const std::optional<ops::Fp8Recipe>& fp8 = std::nullopt);
  Tensor forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;  // (S,B,H) -> (S,B,H)
  // The same with x as its FP8 casts (Norm's FP8 forward), where input_fp8() is defined.
  Tensor forward(const tensor_parallel::Fp8Activation& x, const ForwardContext& fwd, Saved& saved) const;
  // The QKV projection's FP8 state where it takes its input as FP8 casts
  // (ColumnParallelLinear::takes_fp8_input), else null.
  tensor_parallel::Fp8Linear* input_fp8() const { return linear_qkv_.takes_fp8_input() ? linear_qkv_.fp8() : nullptr; }
  Tensor backward(const Tensor& dy, const Saved& saved) const;
  // linear_qkv's and linear_proj's FP8 state, in that order; none in bf16.
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears() const;

 private:
  // forward with fwd.kv_cache: q, k, v of the new positions (RoPE at their offset), k and v
  // appended to the cache, attention of the new queries over every cached key.
  Tensor forward_cached(const Tensor& qkv, const ForwardContext& fwd, Saved& saved) const;
  // forward after the QKV projection.
  Tensor attend(const Tensor& projected, const ForwardContext& fwd, Saved& saved) const;
  // The attention op (the ring or the all-to-all under CP) on saved's q, k, v (or the fused
  // projection): fills saved.out and saved.lse; and its backward on the separate q, k, v.
  void core_attention(Saved& saved) const;
  void core_attention_backward(ops::SplitQkv& d, const Tensor& dout, const Saved& saved) const;
  // RoPE of q or k (S,B,heads,d) in place at the positions this rank holds (under CP both chunks'),
  // or with `inverse` its backward on their gradients.
  void rotate(Tensor& x, bool inverse) const;
  // --qk-layernorm: q and k replaced by their normalised heads; `saved_q` and `saved_k` hold what
  // the norms' backward reads.
  void normalize_heads(Tensor& q, Tensor& k, Norm::Saved& saved_q, Norm::Saved& saved_k) const;

  static int64_t query_groups_per_rank(const TransformerConfig& c, int tp);
  std::string prefix_;
  int64_t heads_local_, total_heads_, head_offset_;  // this rank's query heads: [offset, offset + local) of total
  int64_t groups_local_, head_dim_;
  float attention_dropout_;
  bool rope_;
  int64_t window_;  // sliding window (left size), -1: none
  bool deterministic_;  // --deterministic-mode: the backward's dq summed without atomics
  bool recompute_;  // --recompute-modules core_attn
  ops::RopeParams rope_params_;
  std::shared_ptr<Communicator> cp_;  // the context-parallel group when it has more than one rank, else null
  CpCommType cp_comm_type_;           // --cp-comm-type: the ring, heads exchanged, keys all-gathered, or
                                      // heads exchanged inside cp_a2a_ around the ring over cp_p2p_
  std::shared_ptr<Communicator> cp_a2a_, cp_p2p_;  // the hierarchical CP levels (null unless given)
  tensor_parallel::ColumnParallelLinear linear_qkv_;
  tensor_parallel::RowParallelLinear linear_proj_;
  std::unique_ptr<Norm> q_layernorm_, k_layernorm_;  // --qk-layernorm; null without it
};

}  // namespace megatron
