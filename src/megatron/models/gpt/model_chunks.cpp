#include "megatron/models/gpt/model_chunks.h"

namespace megatron {

ModelChunks::ModelChunks(const TransformerConfig& config, const ParallelContext& ctx, Device device,
                         const pipeline_parallel::PipelineSplit& split)
    : registry_(make_model_registry(ctx)) {
  for (int64_t c = 0; c < split.virtual_stages; ++c) {
    chunks_.push_back(std::make_unique<GPTModel>(config, ctx, device, split.stage(ctx.pp->rank(), c), registry_.get()));
    param_chunks_.resize(registry_->params().size(), c);
  }
  registry_->allocate(config.params_dtype, device);
}

bool ModelChunks::has_embedding() const {
  for (const auto& c : chunks_)
    if (c->stage().embedding) return true;
  return false;
}

bool ModelChunks::has_loss() const {
  for (const auto& c : chunks_)
    if (c->stage().loss) return true;
  return false;
}

std::vector<moe::MoELayer*> ModelChunks::moe_layers() const {
  std::vector<moe::MoELayer*> layers;
  for (const auto& c : chunks_)
    for (moe::MoELayer* layer : c->moe_layers()) layers.push_back(layer);
  return layers;
}

void ModelChunks::update_expert_bias() {
  for (const auto& c : chunks_) c->update_expert_bias();
}

void ModelChunks::update_fp8_scales() const { tensor_parallel::update_fp8_scales(fp8_linears()); }

std::vector<tensor_parallel::Fp8Linear*> ModelChunks::fp8_linears() const {
  std::vector<tensor_parallel::Fp8Linear*> layers;
  for (const auto& c : chunks_)
    for (tensor_parallel::Fp8Linear* fp8 : c->fp8_linears()) layers.push_back(fp8);
  return layers;
}

int64_t ModelChunks::activation_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : chunks_) bytes += c->activation_bytes();
  return bytes;
}

}  // namespace megatron
