#pragma once
// GPTModel (Megatron-Core): embedding (word + optional learned position) -> TransformerBlock ->
// output layer (tied to the word embedding unless untied) -> vocab cross-entropy.
//
// Tokens arrive batch-major (B,S) from the data loader; activations are sequence-major (S,B,H).
#include <memory>

#include "megatron/distributed/parameter.h"
#include "megatron/parallel/comm.h"
#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/transformer_block.h"

namespace megatron {

// The masked loss of a micro-batch: sum(loss * mask) and sum(mask), so any number of
// micro-batches and ranks can be combined exactly before dividing.
struct LossSums {
  double loss_sum = 0.0;
  double num_tokens = 0.0;
};

class GPTModel {
 public:
  // Parameters and activations live on `device`; inputs may come from any device.
  GPTModel(const TransformerConfig& config, const ParallelContext& ctx, Device device = Device::cpu());
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  const TransformerConfig& config() const { return config_; }
  ParameterRegistry& parameters() { return registry_; }
  Device device() const { return device_; }

  // Forward and backward of one micro-batch. tokens, labels (B,S) i32; loss_mask (B,S) f32;
  // position_ids (B,S) i32 or undefined (0..S-1). As in Megatron-Core, position ids feed the
  // learned absolute position embedding; RoPE rotates by the position in the sequence.
  // Gradients of (loss_grad_scale * sum(loss * mask)) accumulate into the main grads.
  LossSums forward_backward(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask, float loss_grad_scale,
                            const ForwardContext& fwd, const Tensor& position_ids = Tensor());
  // Loss only (no dropout, no gradients): validation.
  LossSums evaluate(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                    const Tensor& position_ids = Tensor());
  // Logits (S,B,V_local) for inference.
  Tensor logits(const Tensor& tokens);

 private:
  struct Saved {
    Tensor tokens, positions;
    ops::DropoutParams embedding_dropout;
    TransformerBlock::Saved block;
    tensor_parallel::LinearSaved output;
  };
  Tensor forward_to_logits(const Tensor& tokens, const Tensor& position_ids, const ForwardContext& fwd, Saved& saved);
  LossSums loss_sums(const Tensor& logits, const Tensor& labels_sb, const Tensor& mask_sb, Tensor& lse);

  TransformerConfig config_;
  const ParallelContext* ctx_;
  Device device_;
  ParameterRegistry registry_;
  std::unique_ptr<tensor_parallel::VocabParallelEmbedding> word_embeddings_;
  Parameter* position_embeddings_ = nullptr;
  std::unique_ptr<TransformerBlock> decoder_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> output_layer_;
};

}  // namespace megatron
