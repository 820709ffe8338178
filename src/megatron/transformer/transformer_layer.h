#pragma once
// One pre-norm transformer layer (Megatron-Core TransformerLayer, TE spec names):
//   h   = x + dropout(attention(norm1(x)))
//   out = h + dropout(mlp(norm2(h)))     (mlp: the dense MLP, or the MoE layer, moe/moe_layer.h)
// Every residual addition is fused into the norm after it (residual_stream.h): norm2 adds h, and
// the layer returns out as {h, dropout(mlp(...))} for the next layer's norm1 (or the final norm)
// to add. x may likewise arrive as such a pair.
// Under sequence parallelism x, h and out are this rank's sequence shard (S/TP,B,H): the norms,
// dropouts and residual adds work on the shard; dropout masks are indexed by global element.
#include <memory>
#include <string>
#include <vector>

#include "megatron/ops/dropout.h"
#include "megatron/transformer/attention.h"
#include "megatron/transformer/mlp.h"
#include "megatron/transformer/moe/moe_layer.h"
#include "megatron/transformer/norm.h"
#include "megatron/transformer/residual_stream.h"

namespace megatron {

class TransformerLayer {
 public:
  struct Saved {
    Norm::Saved norm1, norm2;
    SelfAttention::Saved attention;
    MLP::Saved mlp;                                     // a dense layer's MLP
    moe::MoELayer::Saved moe;                           // an MoE layer's experts
    ops::DropoutParams attention_dropout, mlp_dropout;  // masks are regenerated, not stored
    // --recompute-modules layernorm: the norms' outputs the next layers held (the QKV projection's
    // and a dense fc1's bf16 input) were dropped; backward rebuilds them from norm1 and norm2.
    bool qkv_input_dropped = false, fc1_input_dropped = false;
    void count(ActivationMemory& m) const;
  };
  // layer_number: global, 0-based (checkpoint names use global indices, as Megatron HEAD).
  TransformerLayer(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                   int64_t layer_number);
  ResidualStream forward(const ResidualStream& x, const ForwardContext& fwd, Saved& saved) const;
  // dy: the gradient of out; returns the gradient of x.
  Tensor backward(const Tensor& dy, const Saved& saved) const;
  // The MoE layer in place of the MLP, or null for a dense layer.
  moe::MoELayer* moe() const { return moe_.get(); }
  // The FP8 state of the layer's linear layers (attention's, then the dense MLP's); none in bf16.
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears() const;

 private:
  std::string prefix_;
  const ParallelContext* ctx_;
  float hidden_dropout_;
  bool sequence_parallel_;
  bool recompute_norms_;  // --recompute-modules layernorm
  Norm input_norm_;
  SelfAttention self_attention_;
  Norm pre_mlp_norm_;
  std::unique_ptr<MLP> mlp_;            // dense layers
  std::unique_ptr<moe::MoELayer> moe_;  // layers --moe-layer-freq selects
};

}  // namespace megatron
