#pragma once
// Self-attention (Megatron-Core SelfAttention): fused QKV column-parallel projection in the
// per-query-group layout, RoPE, core (flash-style) attention, row-parallel output projection.
// Under TP each rank owns whole query groups: num_query_groups / TP of them, and its heads'
// global indices [head_offset, head_offset + heads_local) of total_heads feed the attention
// dropout's counters, so every TP layout draws the TP=1 masks. With sequence parallelism the
// input and output are sequence shards; attention itself sees the whole sequence (the QKV
// projection gathers it).
// With --recompute-modules core_attn (selective recomputation) the attention op's output and
// log-sum-exp are not kept: backward runs the op again on the saved q, k, v before the output
// projection's backward, which reads the output. The op is deterministic, so the gradients are the
// same bits.
#include <string>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/rope.h"
#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/forward_context.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron {

class SelfAttention {
 public:
  struct Saved {
    tensor_parallel::LinearSaved qkv, proj;
    Tensor q, k, v;   // with RoPE, after it: (S,B,NH_local,d), (S,B,G_local,d)
    Tensor fused;     // without RoPE, instead of q, k, v: the projection (S,B,G_local,(NH/G+2)*d)
    Tensor out, lse;  // empty when recomputed (core_attn)
    ops::AttentionParams attention;
    void count(ActivationMemory& m) const;
  };
  SelfAttention(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                const std::string& prefix);
  Tensor forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const;  // (S,B,H) -> (S,B,H)
  Tensor backward(const Tensor& dy, const Saved& saved) const;

 private:
  // forward with fwd.kv_cache: q, k, v of the new positions (RoPE at their offset), k and v
  // appended to the cache, attention of the new queries over every cached key.
  Tensor forward_cached(const Tensor& qkv, const ForwardContext& fwd, Saved& saved) const;
  // The attention op on saved's q, k, v (or the fused projection): fills saved.out and saved.lse.
  void core_attention(Saved& saved) const;

  static int64_t query_groups_per_rank(const TransformerConfig& c, int tp);
  std::string prefix_;
  int64_t heads_local_, total_heads_, head_offset_;  // this rank's query heads: [offset, offset + local) of total
  int64_t groups_local_, head_dim_;
  float attention_dropout_;
  bool rope_;
  int64_t window_;  // sliding window (left size), -1: none
  bool recompute_;  // --recompute-modules core_attn
  ops::RopeParams rope_params_;
  tensor_parallel::ColumnParallelLinear linear_qkv_;
  tensor_parallel::RowParallelLinear linear_proj_;
};

}  // namespace megatron
