#pragma once
// The decoder: the layers [first, last) owned by this pipeline stage, and the final norm when
// the stage is the last one. Blocks pass the residual stream with its last addition deferred
// (residual_stream.h); after the final norm nothing is deferred.
#include <memory>
#include <vector>

#include "megatron/transformer/transformer_layer.h"

namespace megatron {

class TransformerBlock {
 public:
  struct Saved {
    std::vector<TransformerLayer::Saved> layers;
    Norm::Saved final_norm;
    void count(ActivationMemory& m) const {
      for (const TransformerLayer::Saved& layer : layers) layer.count(m);
      final_norm.count(m);
    }
  };
  TransformerBlock(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                   int64_t first_layer, int64_t last_layer, bool has_final_norm);
  ResidualStream forward(const ResidualStream& x, const ForwardContext& fwd, Saved& saved) const;
  Tensor backward(const Tensor& dy, const Saved& saved) const;
  const std::vector<std::unique_ptr<TransformerLayer>>& layers() const { return layers_; }

 private:
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_norm_;
};

}  // namespace megatron
