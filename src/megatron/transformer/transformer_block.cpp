#include "megatron/transformer/transformer_block.h"

namespace megatron {

TransformerBlock::TransformerBlock(ParameterRegistry& registry, const ParallelContext& ctx,
                                   const TransformerConfig& config, int64_t first_layer, int64_t last_layer,
                                   bool has_final_norm) {
  MEGATRON_CHECK(0 <= first_layer && first_layer <= last_layer && last_layer <= config.num_layers,
                 "layer range [" << first_layer << ", " << last_layer << ") is outside 0.." << config.num_layers);
  for (int64_t i = first_layer; i < last_layer; ++i)
    layers_.push_back(std::make_unique<TransformerLayer>(registry, ctx, config, i));
  if (has_final_norm)
    final_norm_ = std::make_unique<Norm>(registry, config, "decoder.final_layernorm.weight",
                                         "decoder.final_layernorm.bias", Norm::hidden(config, ctx));
}

ResidualStream TransformerBlock::forward(const ResidualStream& x, const ForwardContext& fwd, Saved& saved) const {
  saved.layers.resize(layers_.size());
  ResidualStream h = x;
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(h, fwd, saved.layers[i]);
  if (!final_norm_) return h;
  return {final_norm_->forward(h, saved.final_norm), Tensor()};
}

Tensor TransformerBlock::backward(const Tensor& dy, const Saved& saved) const {
  Tensor d = final_norm_ ? final_norm_->backward(dy, saved.final_norm) : dy;
  for (size_t i = layers_.size(); i-- > 0;) d = layers_[i]->backward(d, saved.layers[i]);
  return d;
}

}  // namespace megatron
