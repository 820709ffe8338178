#pragma once
// GPTModel (Megatron-Core): embedding (word + optional learned position) -> TransformerBlock ->
// output layer (tied to the word embedding unless untied) -> vocab cross-entropy.
//
// Tokens arrive batch-major (B,S) from the data loader; activations are sequence-major (S,B,H).
//
// Under pipeline parallelism a GPTModel is one model chunk of one stage (StageLayers): the global
// layers [first_layer, first_layer + num_layers), the embedding on virtual stage 0, the final norm,
// output layer and loss on the last. Parameters keep their global names, so checkpoints name layers
// by their global number. A stage's output is the residual stream with its deferred addition
// materialised (residual_stream.h), the activation sent to the next stage. With tied embeddings the
// last stage holds its own copy of the word embedding (the same name and initial values: init is a
// function of the name); the training loop sums the two copies' gradients over the embedding
// group, as Megatron does.
//
// Forward reports each module's parameters to the registry (ParameterRegistry::before_forward)
// just before that module reads them: the embeddings, each decoder layer from the first, then the
// output layer (a tied output weight is the word embedding, reported with the embeddings). This is
// what lets DDP wait for each bucket's parameter all-gather only when the forward reaches it.
// Backward reports each module's parameters (ParameterRegistry::grad_ready) as soon as their
// gradients are final: the output layer, then each decoder layer from the last, then the
// embeddings (a tied output weight is final only at the end). This is what lets DDP overlap
// gradient reduction with the rest of backward.
// Each module also reports its parameters once its forward is done with them (after_forward; the
// tied output weight is reported again around the output layer, which reads it) and before its
// backward, or the recomputed forward of a checkpointed segment, reads them (before_backward):
// what lets Megatron FSDP gather sharded parameters for each use and free them after.
#include <memory>
#include <optional>
#include <vector>

#include "megatron/ops/cross_entropy.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/pipeline_parallel/stage_split.h"
#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/transformer_block.h"

namespace megatron {

// The masked loss of a micro-batch: sum(loss * mask) and sum(mask), so any number of
// micro-batches and ranks can be combined exactly before dividing.
struct LossSums {
  double loss_sum = 0.0;
  double num_tokens = 0.0;
};

// One micro-batch's inputs, (B,S): tokens and labels i32, loss_mask f32, position_ids and
// segment_ids i32 or undefined (GPTModel::forward_backward says what they do).
struct MicroBatch {
  Tensor tokens, labels, loss_mask, position_ids, segment_ids;
};

// An empty registry for a model on this rank (its TP and EP ranks).
std::unique_ptr<ParameterRegistry> make_model_registry(const ParallelContext& ctx);

class GPTModel {
 public:
  // What one micro-batch's forward through this stage keeps for its backward.
  // A segment of layers under full recomputation (recompute_config.h) keeps only its input stream
  // and the settings its forward ran with; backward runs that forward again.
  struct LayerCheckpoint {
    ResidualStream input;
    ForwardContext fwd;
  };
  struct Saved {
    Tensor tokens, positions;
    ops::DropoutParams embedding_dropout;
    std::vector<TransformerBlock::Saved> layers;     // per layer block; empty for checkpointed layers
    std::vector<LayerCheckpoint> layer_checkpoints;  // per layer segment; set for checkpointed ones
    tensor_parallel::LinearSaved output;
    Tensor logits, lse, labels_sb, mask_sb;  // the last stage's loss
    // The tensors kept for backward (the token ids are the caller's input, not counted).
    void count(ActivationMemory& m) const {
      m.add(positions);
      for (const TransformerBlock::Saved& layer : layers) layer.count(m);
      for (const LayerCheckpoint& c : layer_checkpoints) {
        m.add(c.input.residual);
        m.add(c.input.delta);
      }
      output.count(m);
      m.add(logits);
      m.add(lse);
    }
  };

  // Parameters and activations live on `device`; inputs may come from any device. `stage`: the
  // pipeline stage this object is; unset, the whole model. `shared`: the registry of every model
  // chunk of this rank (ModelChunks), which registers the parameters there and allocates it once
  // every chunk is built; null: a registry of this model's own, allocated here.
  GPTModel(const TransformerConfig& config, const ParallelContext& ctx, Device device = Device::cpu(),
           const std::optional<pipeline_parallel::StageLayers>& stage = std::nullopt,
           ParameterRegistry* shared = nullptr);
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  const TransformerConfig& config() const { return config_; }
  const pipeline_parallel::StageLayers& stage() const { return stage_; }
  const ParallelContext& context() const { return *ctx_; }
  // The registry the parameters are in (with a shared registry, every chunk's of this rank).
  ParameterRegistry& parameters() { return *registry_; }
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
  // One pipeline stage's forward of a micro-batch. `input` (S,B,H) is the previous stage's output,
  // undefined on the first stage, which embeds mb.tokens. Returns this stage's output for the next
  // stage; the last stage returns undefined and the micro-batch's loss in *sums (only it reads
  // labels and loss_mask).
  Tensor stage_forward(const MicroBatch& mb, const Tensor& input, const ForwardContext& fwd, Saved& saved,
                       LossSums* sums);
  // Its backward: `output_grad` is the gradient of the output (ignored on the last stage, which
  // starts from loss_grad_scale * sum(loss * mask)). Parameter gradients accumulate into the main
  // grads; returns the gradient of `input` (undefined on the first stage).
  Tensor stage_backward(const Tensor& output_grad, float loss_grad_scale, Saved& saved);
  // Loss only (no dropout, no gradients): validation.
  LossSums evaluate(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                    const Tensor& position_ids = Tensor(), const Tensor& segment_ids = Tensor());
  // Logits (S,B,V_local) for inference: this TP rank's columns [tp_rank*V/TP, (tp_rank+1)*V/TP) of
  // the padded vocabulary (the output layer is vocab-parallel).
  // Positions default to 0..S-1; `fwd` carries a generation's key/value cache.
  Tensor logits(const Tensor& tokens, const Tensor& position_ids = Tensor(),
                const ForwardContext& fwd = {.training = false});
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
  // The MoE routers' losses and loads in the last forward_backward (no layers for a dense model).
  const moe::MoEStats& moe_stats() const { return moe_stats_; }
  // Megatron's aux-loss-free balancing step, once per optimizer step: each router's token counts
  // since the last update are summed over the data-parallel ranks and move its expert bias. A
  // collective over DP x CP when any router has an expert bias; nothing otherwise.
  void update_expert_bias();
  // The MoE layers of this rank, first layer first.
  std::vector<moe::MoELayer*> moe_layers() const;
  // Once per optimizer step: the delayed FP8 recipe's amax histories move on and the scales follow
  // (tensor_parallel/fp8_linear.h); nothing for a bf16 model or under current scaling.
  void update_fp8_scales() const;
  // The FP8 state of this rank's linear layers, first layer first; none for a bf16 model.
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears() const;
  // The parameters (registry indices) each part of stage_backward reports before it writes their
  // gradients, in its order: the output layer (with a tied word embedding; empty on stages without
  // the loss), each layer from the last, the embeddings (empty on stages without them). megatron
  // plan times the gradient buckets' memory with it.
  std::vector<std::vector<size_t>> backward_param_order() const;

 private:
  // Registration indices [begin, end) of the parameters one module registered.
  struct ParamSpan {
    size_t begin = 0, end = 0;
  };
  // Tells the registry about each parameter of a span (ParameterRegistry's notifications).
  using Notification = void (ParameterRegistry::*)(const Parameter&) const;
  void report(Notification notify, const ParamSpan& span) const;
  // The output layer's parameters: its own, or the tied word embedding it reads.
  void report_output(Notification notify) const;
  // The output layer's forward, reported to the registry.
  Tensor output_forward(const Tensor& h, tensor_parallel::LinearSaved& saved);
  // The whole model (both ends of the pipeline), for the single-stage entry points.
  void require_whole_model(const char* what) const;
  Tensor embed(const MicroBatch& mb, const ForwardContext& fwd, Saved& saved);
  // Through the stage's layers to its output: the final norm's on the last stage, else the
  // materialised residual stream.
  Tensor forward_layers(const MicroBatch& mb, const Tensor& input, const ForwardContext& fwd, Saved& saved);
  // The layer blocks of one segment forward from x, block i filling saved[i - segment.begin].
  // `recompute`: the rerun in backward, which reports nothing to the registry (the forward did).
  ResidualStream forward_segment(const LayerSegment& segment, const ResidualStream& x, const ForwardContext& fwd,
                                 TransformerBlock::Saved* saved, bool recompute = false);
  LossSums loss_sums(const Tensor& logits, const Tensor& labels_sb, const Tensor& mask_sb, Tensor& lse);
  // This rank's columns of the logits: the vocabulary rows of the (tied or not) output layer.
  ops::VocabShard vocab_shard() const;
  // (S,B,V/TP) logits -> the last position's (B,V), gathered over TP.
  Tensor gather_last_position(const Tensor& logits) const;

  TransformerConfig config_;
  pipeline_parallel::StageLayers stage_;
  const ParallelContext* ctx_;
  Device device_;
  std::unique_ptr<ParameterRegistry> own_registry_;  // null with a shared registry
  ParameterRegistry* registry_;
  std::unique_ptr<tensor_parallel::VocabParallelEmbedding> word_embeddings_;
  Parameter* position_embeddings_ = nullptr;
  // The stage's decoder as one block per layer (the last stage's last holds the final norm; a last
  // stage without layers has a block of the final norm alone), so backward can report
  // each layer's gradients as final as soon as that layer is done.
  std::vector<std::unique_ptr<TransformerBlock>> decoder_;
  // The blocks of decoder_ in runs; full recomputation checkpoints some (recompute_segments).
  std::vector<LayerSegment> layer_segments_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> output_layer_;
  ParamSpan embedding_params_, output_params_;
  std::vector<ParamSpan> layer_params_;
  int64_t activation_bytes_ = 0;
  moe::MoEStats moe_stats_;
};

}  // namespace megatron
