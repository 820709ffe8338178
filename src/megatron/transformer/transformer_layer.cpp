#include "megatron/transformer/transformer_layer.h"

#include "megatron/tensor_parallel/mappings.h"

namespace megatron {

namespace {
std::string layer_prefix(int64_t n) { return "decoder.layers." + std::to_string(n); }

bool is_moe_layer(const TransformerConfig& config, int64_t layer_number) {
  if (!config.moe.enabled()) return false;
  std::string why;
  const std::vector<bool> pattern = moe_layer_pattern(config.moe.moe_layer_freq, config.num_layers, &why);
  MEGATRON_CHECK(!pattern.empty(), "--moe-layer-freq '" << config.moe.moe_layer_freq << "': " << why);
  return pattern[size_t(layer_number)];
}

// The recipe of this layer's GEMMs, or none when they stay in bf16 (--first-last-layers-bf16).
std::optional<ops::Fp8Recipe> layer_fp8(const TransformerConfig& config, int64_t layer_number) {
  if (!config.fp8.layer_in_fp8(layer_number, config.num_layers)) return std::nullopt;
  return config.fp8.recipe();
}

// Dropout with p = 0 is the identity: no pass over the tensor at all (evaluation, and the
// dropout-free recipes of LLaMA-style training).
void dropout_in_place(Tensor& x, const ops::DropoutParams& p) {
  if (p.p > 0.0f) ops::dropout_forward(x, x, p);
}
Tensor dropout_grad(const Tensor& dy, const ops::DropoutParams& p) {
  if (p.p == 0.0f) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  ops::dropout_backward(dx, dy, p);
  return dx;
}
}  // namespace

TransformerLayer::TransformerLayer(ParameterRegistry& registry, const ParallelContext& ctx,
                                   const TransformerConfig& config, int64_t layer_number)
    : prefix_(layer_prefix(layer_number)),
      ctx_(&ctx),
      hidden_dropout_(config.hidden_dropout),
      sequence_parallel_(ctx.sequence_parallel()),
      recompute_norms_(config.recompute.recomputes("layernorm")),
      input_norm_(registry, config, prefix_ + ".self_attention.linear_qkv.layer_norm_weight",
                  prefix_ + ".self_attention.linear_qkv.layer_norm_bias", Norm::hidden(config, ctx)),
      self_attention_(registry, ctx, config, prefix_ + ".self_attention", layer_fp8(config, layer_number)),
      // Megatron's MoE spec keeps the pre-MLP norm as its own module (no fused fc1 to carry it).
      pre_mlp_norm_(registry, config,
                    prefix_ + (is_moe_layer(config, layer_number) ? ".pre_mlp_layernorm.weight"
                                                                  : ".mlp.linear_fc1.layer_norm_weight"),
                    prefix_ + (is_moe_layer(config, layer_number) ? ".pre_mlp_layernorm.bias"
                                                                  : ".mlp.linear_fc1.layer_norm_bias"),
                    Norm::hidden(config, ctx)),
      mlp_(is_moe_layer(config, layer_number)
               ? nullptr
               : std::make_unique<MLP>(registry, ctx, config, prefix_ + ".mlp", layer_fp8(config, layer_number))),
      moe_(is_moe_layer(config, layer_number) ? std::make_unique<moe::MoELayer>(registry, ctx, config, prefix_ + ".mlp")
                                              : nullptr) {}

ResidualStream TransformerLayer::forward(const ResidualStream& x, const ForwardContext& fwd, Saved& saved) const {
  const float p = fwd.dropout_p(hidden_dropout_);
  // Under SP x is this rank's sequence shard: its elements are drawn at their global indices.
  const uint64_t offset = sequence_parallel_ ? tensor_parallel::sequence_shard_offset(x.residual, *ctx_) : 0;
  saved.attention_dropout = {p, fwd.seed, fwd.random_stream(prefix_ + ".self_attn_bda"), offset};
  saved.mlp_dropout = {p, fwd.seed, fwd.random_stream(prefix_ + ".mlp_bda"), offset};

  // norm1 materialises x (saved.norm1.input) if x arrived as a pair; norm2 computes h = x + a.
  // Where the next GEMM takes FP8 input (the delayed recipe), a norm hands it the casts of its
  // output instead of the output (Norm's FP8 forward).
  tensor_parallel::Fp8Linear* qkv_fp8 = self_attention_.input_fp8();
  Tensor a = qkv_fp8 ? self_attention_.forward(input_norm_.forward(x, saved.norm1, *qkv_fp8), fwd, saved.attention)
                     : self_attention_.forward(input_norm_.forward(x, saved.norm1), fwd, saved.attention);
  // Where a norm's output is kept in bf16 by the GEMM it feeds (an FP8 GEMM keeps casts instead),
  // layernorm recompute drops it: backward normalises the saved stream value again.
  const auto drop = [this](Tensor& kept) {
    if (!recompute_norms_ || !kept.defined()) return false;
    kept = Tensor();
    return true;
  };
  saved.qkv_input_dropped = drop(saved.attention.qkv.input);
  dropout_in_place(a, saved.attention_dropout);
  const ResidualStream h{saved.norm1.input, a};
  Tensor m;
  if (moe_)
    m = moe_->forward(pre_mlp_norm_.forward(h, saved.norm2), fwd, saved.moe);
  else if (tensor_parallel::Fp8Linear* fc1_fp8 = mlp_->input_fp8())
    m = mlp_->forward(pre_mlp_norm_.forward(h, saved.norm2, *fc1_fp8), saved.mlp);
  else
    m = mlp_->forward(pre_mlp_norm_.forward(h, saved.norm2), saved.mlp);
  if (mlp_) saved.fc1_input_dropped = drop(saved.mlp.fc1.input);  // an MoE layer keeps its own copies
  dropout_in_place(m, saved.mlp_dropout);
  return {saved.norm2.input, m};  // out = h + m, added by the next norm
}

std::vector<tensor_parallel::Fp8Linear*> TransformerLayer::fp8_linears() const {
  std::vector<tensor_parallel::Fp8Linear*> layers = self_attention_.fp8_linears();
  if (mlp_)
    for (tensor_parallel::Fp8Linear* fp8 : mlp_->fp8_linears()) layers.push_back(fp8);
  return layers;
}

void TransformerLayer::Saved::count(ActivationMemory& m) const {
  norm1.count(m);
  attention.count(m);
  norm2.count(m);
  mlp.count(m);
  moe.count(m);
}

Tensor TransformerLayer::backward(const Tensor& dy, const Saved& saved) const {
  // Residual stream: the gradient reaching h is dy (skip path) plus what flows back through the
  // MLP and norm2; the norm's backward adds the two in one pass. Likewise for x.
  const Tensor dm = dropout_grad(dy, saved.mlp_dropout);
  Tensor dmlp_input;
  if (moe_) {
    dmlp_input = moe_->backward(dm, saved.moe);
  } else if (saved.fc1_input_dropped) {
    MLP::Saved mlp = saved.mlp;
    mlp.fc1.input = pre_mlp_norm_.recompute(saved.norm2);
    dmlp_input = mlp_->backward(dm, mlp);
  } else {
    dmlp_input = mlp_->backward(dm, saved.mlp);
  }
  Tensor dh = pre_mlp_norm_.backward(dmlp_input, saved.norm2, dy);
  const Tensor da = dropout_grad(dh, saved.attention_dropout);
  Tensor dattention_input;
  if (saved.qkv_input_dropped) {
    SelfAttention::Saved attention = saved.attention;
    attention.qkv.input = input_norm_.recompute(saved.norm1);
    dattention_input = self_attention_.backward(da, attention);
  } else {
    dattention_input = self_attention_.backward(da, saved.attention);
  }
  return input_norm_.backward(dattention_input, saved.norm1, dh);
}

}  // namespace megatron
