#pragma once
// GPTModel (Megatron-Core): embedding (word + optional learned position) -> TransformerBlock ->
// output layer (tied to the word embedding unless untied) -> vocab cross-entropy.
//
// Tokens arrive batch-major (B,S) from the data loader; activations are sequence-major (S,B,H).
//
// Forward reports each module's parameters to the registry (ParameterRegistry::before_forward)
// just before that module reads them: the embeddings, each decoder layer from the first, then the
// output layer (a tied output weight is the word embedding, reported with the embeddings). This is
// what lets DDP wait for each bucket's parameter all-gather only when the forward reaches it.
// Backward reports each module's parameters (ParameterRegistry::grad_ready) as soon as their
// gradients are final: the output layer, then each decoder layer from the last, then the
// embeddings (a tied output weight is final only at the end). This is what lets DDP overlap
// gradient reduction with the rest of backward.
#include <memory>
#include <vector>

#include "megatron/ops/cross_entropy.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
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
  const ParallelContext& context() const { return *ctx_; }
  ParameterRegistry& parameters() { return registry_; }
  Device device() const { return device_; }

  // Forward and backward of one micro-batch. tokens, labels (B,S) i32; loss_mask (B,S) f32;
  // position_ids (B,S) i32 or undefined (0..S-1). As in Megatron-Core, position ids feed the
  // learned absolute position embedding; RoPE rotates by the position in the sequence.
  // segment_ids (B,S) i32 or undefined: document masking (ForwardContext::segment_ids); `fwd`'s
  // own segment_ids are ignored.
  // Gradients of (loss_grad_scale * sum(loss * mask)) accumulate into the main grads.
  LossSums forward_backward(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask, float loss_grad_scale,
                            const ForwardContext& fwd, const Tensor& position_ids = Tensor(),
                            const Tensor& segment_ids = Tensor());
  // Loss only (no dropout, no gradients): validation.
  LossSums evaluate(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                    const Tensor& position_ids = Tensor(), const Tensor& segment_ids = Tensor());
  // Logits (S,B,V_local) for inference: this TP rank's columns [tp_rank*V/TP, (tp_rank+1)*V/TP) of
  // the padded vocabulary (the output layer is vocab-parallel).
  Tensor logits(const Tensor& tokens);
  // The last position's logits over the whole padded vocabulary, (B,V), the same on every TP rank:
  // what a sampler reads. Megatron gathers all (S,B,V) logits over TP for inference
  // (gather_from_tensor_model_parallel_region); one all-gather of the last row is all we need.
  Tensor last_position_logits(const Tensor& tokens);
  // Generation with a key/value cache (transformer/kv_cache.h): runs `tokens` (B,S) as positions
  // [cache.length, cache.length + S), attending to the cached positions too, appends their keys and
  // values and advances cache.length; returns the last position's logits as last_position_logits
  // does. The same logits as last_position_logits of the whole sequence, for S new tokens' work.
  Tensor next_logits(const Tensor& tokens, KvCache& cache);
  // Activation memory of the last forward_backward on this rank: the bytes its forward kept for
  // the backward (every module's saved tensors, the logits and the loss's lse; dropout masks are
  // regenerated, not kept). Under sequence parallelism every per-layer term is divided by TP.
  int64_t activation_bytes() const { return activation_bytes_; }

 private:
  struct Saved {
    Tensor tokens, positions;
    ops::DropoutParams embedding_dropout;
    std::vector<TransformerBlock::Saved> layers;
    tensor_parallel::LinearSaved output;
    // The tensors kept for backward (the token ids are the caller's input, not counted).
    void count(ActivationMemory& m) const {
      m.add(positions);
      for (const TransformerBlock::Saved& layer : layers) layer.count(m);
      output.count(m);
    }
  };
  // Registration indices [begin, end) of the parameters one module registered.
  struct ParamSpan {
    size_t begin = 0, end = 0;
  };
  void report_before_forward(const ParamSpan& span) const;
  void report_grads_ready(const ParamSpan& span) const;
  Tensor forward_to_logits(const Tensor& tokens, const Tensor& position_ids, const Tensor& segment_ids,
                           const ForwardContext& fwd, Saved& saved);
  LossSums loss_sums(const Tensor& logits, const Tensor& labels_sb, const Tensor& mask_sb, Tensor& lse);
  // This rank's columns of the logits: the vocabulary rows of the (tied or not) output layer.
  ops::VocabShard vocab_shard() const;
  // (S,B,V/TP) logits -> the last position's (B,V), gathered over TP.
  Tensor gather_last_position(const Tensor& logits) const;

  TransformerConfig config_;
  const ParallelContext* ctx_;
  Device device_;
  ParameterRegistry registry_;
  std::unique_ptr<tensor_parallel::VocabParallelEmbedding> word_embeddings_;
  Parameter* position_embeddings_ = nullptr;
  // The decoder as one block per layer (the last holds the final norm), so backward can report
  // each layer's gradients as final as soon as that layer is done.
  std::vector<std::unique_ptr<TransformerBlock>> decoder_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> output_layer_;
  ParamSpan embedding_params_, output_params_;
  std::vector<ParamSpan> layer_params_;
  int64_t activation_bytes_ = 0;
};

}  // namespace megatron
