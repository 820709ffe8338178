#pragma once
// This pipeline rank's model: one GPTModel chunk per virtual stage it holds (the split's
// stage(rank, c), c = 0..V-1; one chunk without interleaving), every chunk's parameters registered
// in one ParameterRegistry. Data parallelism, the optimizer, the gradient norm and checkpoints act
// on that registry, so they see the rank's chunks as one model; parameters keep their global names,
// so a checkpoint does not depend on how the layers were split. Chunks register in order (chunk 0
// first), which is the order the interleaved schedule's first forwards read them and the reverse of
// the order its last backwards finish them, as DDP's bucketing expects.
#include <memory>
#include <vector>

#include "megatron/models/gpt/gpt_model.h"
#include "megatron/pipeline_parallel/stage_split.h"

namespace megatron {

class ModelChunks {
 public:
  ModelChunks(const TransformerConfig& config, const ParallelContext& ctx, Device device,
              const pipeline_parallel::PipelineSplit& split);
  ModelChunks(const ModelChunks&) = delete;
  ModelChunks& operator=(const ModelChunks&) = delete;

  int64_t size() const { return int64_t(chunks_.size()); }
  GPTModel& chunk(int64_t c) const { return *chunks_.at(size_t(c)); }
  const TransformerConfig& config() const { return chunks_.front()->config(); }
  Device device() const { return chunks_.front()->device(); }
  ParameterRegistry& parameters() { return *registry_; }
  // Per parameter (registration order) the chunk holding it: DDP keeps each chunk's buckets apart.
  const std::vector<int64_t>& param_chunks() const { return param_chunks_; }

  // Whether some chunk embeds tokens (virtual stage 0) or computes the loss (the last one).
  bool has_embedding() const;
  bool has_loss() const;
  // Every chunk's MoE layers, chunk 0's first.
  std::vector<moe::MoELayer*> moe_layers() const;
  // Each chunk's aux-loss-free balancing step (GPTModel::update_expert_bias), chunk 0's first.
  void update_expert_bias();
  // Every chunk's FP8 scale update (GPTModel::update_fp8_scales), as one batched op.
  void update_fp8_scales() const;
  // Every chunk's FP8 linear layers, chunk 0's first.
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears() const;
  // The bytes the chunks' last forwards kept for backward: one micro-batch through this rank.
  int64_t activation_bytes() const;

 private:
  std::unique_ptr<ParameterRegistry> registry_;
  std::vector<std::unique_ptr<GPTModel>> chunks_;
  std::vector<int64_t> param_chunks_;
};

}  // namespace megatron
