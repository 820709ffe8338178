#include "megatron/models/gpt/gpt_model.h"

#include <algorithm>

#include "megatron/ops/attention.h"
#include "megatron/ops/cross_entropy.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/embedding.h"
#include "megatron/ops/reduce.h"
#include "megatron/tensor_parallel/mappings.h"

namespace megatron {

namespace {
DType loss_dtype(DType activations) { return activations == DType::f64 ? DType::f64 : DType::f32; }

Tensor default_position_ids(int64_t B, int64_t S, Device device) {
  Tensor p = Tensor::empty({B, S}, DType::i32);
  int32_t* d = p.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) d[b * S + s] = int32_t(s);
  return p.to(device);
}

// (B,S) -> (S,B) on `device`, flattened to N = S*B: the row order of the logits.
Tensor to_sequence_major(const Tensor& bs, Device device) {
  const Tensor in = bs.to(device);
  Tensor out = Tensor::empty({bs.dim(1), bs.dim(0)}, bs.dtype(), device);
  ops::transpose01(out, in);
  return out.view({-1});
}

// Columns [s0, s1) of (B,S) ids, as a (B, s1-s0) tensor: the positions of a sequence shard.
Tensor sequence_columns(const Tensor& ids_bs, int64_t s0, int64_t s1) {
  const int64_t B = ids_bs.dim(0), S = ids_bs.dim(1);
  Tensor sb = Tensor::empty({S, B}, ids_bs.dtype(), ids_bs.device());
  ops::transpose01(sb, ids_bs);
  Tensor out = Tensor::empty({B, s1 - s0}, ids_bs.dtype(), ids_bs.device());
  ops::transpose01(out, sb.slice(s0, s1));
  return out;
}
}  // namespace

std::unique_ptr<ParameterRegistry> make_model_registry(const ParallelContext& ctx) {
  return std::make_unique<ParameterRegistry>(ctx.tp_rank(), ctx.tp_size(), ctx.ep ? ctx.ep->rank() : 0,
                                             ctx.ep ? ctx.ep->size() : 1, ctx.expert_tp ? ctx.expert_tp->rank() : 0,
                                             ctx.expert_tp ? ctx.expert_tp->size() : 0);
}

GPTModel::GPTModel(const TransformerConfig& config, const ParallelContext& ctx, Device device,
                   const std::optional<pipeline_parallel::StageLayers>& stage, ParameterRegistry* shared)
    : config_(config),
      stage_(stage.value_or(pipeline_parallel::StageLayers{0, config.num_layers, true, true})),
      ctx_(&ctx),
      device_(device),
      own_registry_(shared ? nullptr : make_model_registry(ctx)),
      registry_(shared ? shared : own_registry_.get()) {
  MEGATRON_CHECK(config.padded_vocab_size > 0, "padded_vocab_size is not set; derive the config before building");
  const int64_t end = stage_.first_layer + stage_.num_layers;
  MEGATRON_CHECK(stage_.first_layer >= 0 && stage_.num_layers >= 0 && end <= config.num_layers,
                 "pipeline stage layers [" << stage_.first_layer << ", " << end << ") are outside the model's "
                                           << config.num_layers << " layers");
  const auto registered = [this] { return registry_->params().size(); };
  const size_t first_param = registered();  // the chunks before this one's, in a shared registry
  const bool tied = !config.untie_embeddings_and_output_weights;
  // The last stage of a tied model holds the word embedding too: its output layer's weight.
  if (stage_.embedding || (stage_.loss && tied)) {
    word_embeddings_ = std::make_unique<tensor_parallel::VocabParallelEmbedding>(
        *registry_, ctx, "embedding.word_embeddings.weight", config.padded_vocab_size, config.hidden_size,
        config.init_method_std, config.deterministic_mode);
    // Marked before the buffers are laid out (allocate, below), where nothing has read it yet.
    word_embeddings_->weight()->spec.pipeline_copy = !stage_.embedding;
    word_embeddings_->weight()->spec.shared_embedding = tied && stage_.embedding != stage_.loss;
    word_embeddings_->weight()->spec.embedding_or_output = true;
  }
  // Replicated; under SP added to this rank's sequence shard only, so its gradient is summed over
  // TP before the optimizer.
  if (stage_.embedding && config.position_embedding_type == PositionEmbeddingType::learned_absolute)
    position_embeddings_ = registry_->add({.name = "embedding.position_embeddings.weight",
                                           .global_shape = {config.max_position_embeddings, config.hidden_size},
                                           .init_std = config.init_method_std,
                                           .sequence_parallel = ctx.sequence_parallel()});
  embedding_params_ = {first_param, registered()};
  for (int64_t i = stage_.first_layer; i < end || (i == end && stage_.loss && stage_.num_layers == 0); ++i) {
    const size_t begin = registered();
    const int64_t last = std::min(i + 1, end);
    decoder_.push_back(
        std::make_unique<TransformerBlock>(*registry_, ctx, config, i, last, stage_.loss && last == end));
    layer_params_.push_back({begin, registered()});
  }
  layer_segments_ = recompute_segments(config.recompute, int64_t(decoder_.size()));
  output_params_ = {registered(), registered()};
  if (stage_.loss) {
    tensor_parallel::ColumnParallelLinear::Options out{.bias = false, .init_std = config.init_method_std};
    if (tied) out.shared_weight = word_embeddings_->weight();
    output_layer_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
        *registry_, ctx, "output_layer", config.hidden_size, config.padded_vocab_size, out);
    output_layer_->weight()->spec.embedding_or_output = true;  // the word embedding when tied
    output_params_.end = registered();
  }
  if (own_registry_) own_registry_->allocate(config.params_dtype, device);
}

void GPTModel::require_whole_model(const char* what) const {
  MEGATRON_CHECK(stage_.embedding && stage_.loss,
                 "GPTModel::" << what << " runs the whole model, but this object is "
                              << "one pipeline stage; run stage_forward/stage_backward");
}

Tensor GPTModel::embed(const MicroBatch& mb, const ForwardContext& fwd, Saved& saved) {
  const Tensor& tokens = mb.tokens;
  MEGATRON_CHECK(
      tokens.dim(1) <= config_.max_position_embeddings,
      "sequence of " << tokens.dim(1) << " tokens exceeds max_position_embeddings " << config_.max_position_embeddings);
  saved.tokens = tokens.to(device_);
  report(&ParameterRegistry::before_forward, embedding_params_);
  Tensor h = word_embeddings_->forward(saved.tokens);  // (S,B,H), or this rank's (S/TP,B,H) under SP
  if (position_embeddings_) {
    saved.positions = mb.position_ids.defined() ? mb.position_ids.to(device_)
                                                : default_position_ids(tokens.dim(0), tokens.dim(1), device_);
    if (ctx_->sequence_parallel()) {
      const int64_t s0 = ctx_->tp_rank() * h.dim(0);
      saved.positions = sequence_columns(saved.positions, s0, s0 + h.dim(0));
    }
    ops::embedding_forward(h, saved.positions, position_embeddings_->data, {.accumulate = true});
  }
  saved.embedding_dropout = {fwd.dropout_p(config_.hidden_dropout), fwd.seed, fwd.random_stream("embedding"),
                             ctx_->sequence_parallel() ? tensor_parallel::sequence_shard_offset(h, *ctx_) : 0};
  if (saved.embedding_dropout.p > 0.0f) ops::dropout_forward(h, h, saved.embedding_dropout);
  report(&ParameterRegistry::after_forward, embedding_params_);
  return h;
}

Tensor GPTModel::forward_layers(const MicroBatch& mb, const Tensor& input, const ForwardContext& fwd, Saved& saved) {
  MEGATRON_CHECK(stage_.embedding || input.defined(),
                 "pipeline stage of layers [" << stage_.first_layer << ", " << stage_.first_layer + stage_.num_layers
                                              << ") got no input activation");
  ResidualStream stream{stage_.embedding ? embed(mb, fwd, saved) : input, Tensor()};
  ForwardContext layer_fwd = fwd;
  if (mb.segment_ids.defined()) {
    // Under CP the ring and the all-to-all pass each key's document with it (segment ids); a whole
    // sequence takes the variable-length path (packed documents), derived once per micro-batch.
    if (ctx_->cp && ctx_->cp->size() > 1) {
      layer_fwd.segment_ids = mb.segment_ids.to(device_);
    } else {
      const Tensor host = mb.segment_ids.device().is_cpu() ? mb.segment_ids : mb.segment_ids.to(Device::cpu());
      const Tensor cu_seqlens = ops::packed_cu_seqlens(host);
      layer_fwd.cu_seqlens = cu_seqlens.to(device_);
      layer_fwd.max_seqlen = ops::longest_document(cu_seqlens);
    }
  }
  saved.layers.assign(decoder_.size(), {});
  saved.layer_checkpoints.assign(layer_segments_.size(), {});
  moe_stats_ = {};
  for (size_t s = 0; s < layer_segments_.size(); ++s) {
    const LayerSegment& segment = layer_segments_[s];
    const bool checkpointed = segment.checkpointed && fwd.training;  // evaluation runs no backward
    if (checkpointed) {
      saved.layer_checkpoints[s] = {stream, layer_fwd};
      saved.layer_checkpoints[s].fwd.recompute = true;  // what backward runs again counts nothing again
    }
    stream = forward_segment(segment, stream, layer_fwd, &saved.layers[size_t(segment.begin)]);
    // The routing statistics of the segment's MoE layers, before a checkpointed segment's layers
    // drop what they saved (the stream they return stays alive).
    for (int64_t i = segment.begin; i < segment.end; ++i) {
      for (size_t j = 0; j < decoder_[size_t(i)]->layers().size(); ++j)
        if (const moe::MoELayer* moe = decoder_[size_t(i)]->layers()[j]->moe())
          moe->add_stats(saved.layers[size_t(i)].layers[j].moe, moe_stats_);
      if (checkpointed) saved.layers[size_t(i)] = {};
    }
  }
  // The last block ends with the final norm, which leaves nothing deferred; a stage boundary
  // materialises the deferred addition, since the next stage's norm is on another rank.
  if (!stream.delta.defined()) return stream.residual;
  Tensor out = Tensor::empty(stream.residual.shape(), stream.residual.dtype(), device_);
  ops::add(out, stream.residual, stream.delta);
  return out;
}

ResidualStream GPTModel::forward_segment(const LayerSegment& segment, const ResidualStream& x,
                                         const ForwardContext& fwd, TransformerBlock::Saved* saved, bool recompute) {
  ResidualStream stream = x;
  for (int64_t i = segment.begin; i < segment.end; ++i) {
    if (!recompute) report(&ParameterRegistry::before_forward, layer_params_[size_t(i)]);
    stream = decoder_[size_t(i)]->forward(stream, fwd, saved[i - segment.begin]);
    if (!recompute) report(&ParameterRegistry::after_forward, layer_params_[size_t(i)]);
  }
  return stream;
}

std::vector<std::vector<size_t>> GPTModel::backward_param_order() const {
  const auto indices = [](const ParamSpan& span) {
    std::vector<size_t> out;
    for (size_t i = span.begin; i < span.end; ++i) out.push_back(i);
    return out;
  };
  std::vector<std::vector<size_t>> order{indices(output_params_)};
  if (stage_.loss && !config_.untie_embeddings_and_output_weights)
    order[0].push_back(word_embeddings_->weight()->index);
  for (size_t i = layer_params_.size(); i-- > 0;) order.push_back(indices(layer_params_[i]));
  order.push_back(stage_.embedding ? indices(embedding_params_) : std::vector<size_t>{});
  return order;
}

void GPTModel::report(Notification notify, const ParamSpan& span) const {
  for (size_t i = span.begin; i < span.end; ++i) (registry_->*notify)(*registry_->params()[i]);
}

// A tied model's output layer reads the word embedding: on a last stage that does not embed, its
// copy (with the distributed optimizer alone in its bucket, whose gather before_forward waits for).
void GPTModel::report_output(Notification notify) const {
  report(notify, output_params_);
  if (!config_.untie_embeddings_and_output_weights) (registry_->*notify)(*word_embeddings_->weight());
}

Tensor GPTModel::output_forward(const Tensor& h, tensor_parallel::LinearSaved& saved) {
  report_output(&ParameterRegistry::before_forward);
  Tensor logits = output_layer_->forward(h, saved);
  report_output(&ParameterRegistry::after_forward);
  return logits;
}

ops::VocabShard GPTModel::vocab_shard() const {
  // The output layer is column-parallel: rank r holds vocabulary rows [r·V/TP, (r+1)·V/TP).
  return {.start = ctx_->tp_rank() * output_layer_->output_size_per_partition(), .size = config_.padded_vocab_size};
}

// Vocab-parallel cross-entropy: each rank reduces its vocabulary columns to (max, sum of exp,
// target logit) per token, one all-gather over TP exchanges them, and every rank combines them
// into the same per-token loss and lse. The full logits never exist on any rank.
LossSums GPTModel::loss_sums(const Tensor& logits, const Tensor& labels_sb, const Tensor& mask_sb, Tensor& lse) {
  const int64_t N = labels_sb.numel();
  const DType dt = loss_dtype(logits.dtype());
  Tensor partial = Tensor::empty({3, N}, dt, logits.device());
  ops::cross_entropy_partial_forward(partial, logits.view({N, -1}), labels_sb, vocab_shard());
  Tensor partials = Tensor::empty({ctx_->tp_size(), 3, N}, dt, logits.device());
  ctx_->tp->all_gather(partials, partial);
  Tensor losses = Tensor::empty({N}, dt, logits.device());
  lse = Tensor::empty({N}, dt, logits.device());
  ops::cross_entropy_combine(losses, lse, partials);
  Tensor acc = Tensor::zeros({2}, dt, logits.device());
  Tensor loss_acc = acc.slice(0, 1), count_acc = acc.slice(1, 2);
  const Tensor mask = mask_sb.dtype() == dt ? mask_sb : mask_sb.to(dt);
  ops::dot(loss_acc, losses, mask);
  ops::dot(count_acc, mask, mask);  // the mask is 0/1, so sum(mask^2) counts tokens
  const LossSums sums{acc.item(0), acc.item(1)};
  // The read-back waited for the loss kernels: an out-of-range target they recorded raises now,
  // with the CPU's message, before the backward runs on it.
  ops::cross_entropy_check_targets(logits.device());
  return sums;
}

Tensor GPTModel::stage_forward(const MicroBatch& mb, const Tensor& input, const ForwardContext& fwd, Saved& saved,
                               LossSums* sums) {
  Tensor h = forward_layers(mb, input, fwd, saved);
  if (stage_.loss) {
    saved.logits = output_forward(h, saved.output);
    saved.labels_sb = to_sequence_major(mb.labels, device_);
    saved.mask_sb = to_sequence_major(mb.loss_mask, device_);
    const LossSums loss = loss_sums(saved.logits, saved.labels_sb, saved.mask_sb, saved.lse);
    if (sums) *sums = loss;
    h = Tensor();
  }
  ActivationMemory memory;
  saved.count(memory);
  activation_bytes_ = int64_t(memory.bytes());
  return h;
}

Tensor GPTModel::stage_backward(const Tensor& output_grad, float loss_grad_scale, Saved& saved) {
  Tensor d = output_grad;
  if (stage_.loss) {
    // dlogits overwrite the logits in place: no second vocabulary-sized buffer.
    Tensor logits_rows = saved.logits.view({saved.labels_sb.numel(), -1});
    ops::cross_entropy_backward(logits_rows, logits_rows, saved.labels_sb, saved.lse, saved.mask_sb, loss_grad_scale,
                                vocab_shard());
    report_output(&ParameterRegistry::before_backward);
    d = output_layer_->backward(saved.logits, saved.output);
    report(&ParameterRegistry::grad_ready, output_params_);
    // What a backward has read goes at once, as autograd frees a node's saved tensors: the
    // activations shrink while the gradient buckets DDP takes during the backward grow.
    saved.logits = Tensor();
    saved.output = {};
  }
  for (size_t s = layer_segments_.size(); s-- > 0;) {
    const LayerSegment& segment = layer_segments_[s];
    const LayerCheckpoint& checkpoint = saved.layer_checkpoints[s];
    std::vector<TransformerBlock::Saved> recomputed;
    if (checkpoint.input.residual.defined()) {  // full recomputation: this segment's forward again
      for (int64_t i = segment.begin; i < segment.end; ++i)
        report(&ParameterRegistry::before_backward, layer_params_[size_t(i)]);
      recomputed.resize(size_t(segment.end - segment.begin));
      forward_segment(segment, checkpoint.input, checkpoint.fwd, recomputed.data(), /*recompute=*/true);
    }
    for (int64_t i = segment.end; i-- > segment.begin;) {
      report(&ParameterRegistry::before_backward, layer_params_[size_t(i)]);
      TransformerBlock::Saved& layer =
          recomputed.empty() ? saved.layers[size_t(i)] : recomputed[size_t(i - segment.begin)];
      d = decoder_[size_t(i)]->backward(d, layer);
      layer = {};
      report(&ParameterRegistry::grad_ready, layer_params_[size_t(i)]);
    }
    saved.layer_checkpoints[s] = {};
  }
  if (!stage_.embedding) {
    report(&ParameterRegistry::grad_ready, embedding_params_);  // a tied last stage's copy of the word embedding
    return d;
  }
  report(&ParameterRegistry::before_backward, embedding_params_);
  if (saved.embedding_dropout.p > 0.0f) ops::dropout_backward(d, d, saved.embedding_dropout);
  if (position_embeddings_)
    ops::embedding_backward(position_embeddings_->main_grad, d, saved.positions,
                            {.deterministic = config_.deterministic_mode});
  word_embeddings_->backward(d, saved.tokens);
  report(&ParameterRegistry::grad_ready, embedding_params_);
  return Tensor();
}

LossSums GPTModel::forward_backward(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                                    float loss_grad_scale, const ForwardContext& fwd, const Tensor& position_ids,
                                    const Tensor& segment_ids) {
  require_whole_model("forward_backward");
  Saved saved;
  LossSums sums;
  stage_forward({tokens, labels, loss_mask, position_ids, segment_ids}, Tensor(), fwd, saved, &sums);
  stage_backward(Tensor(), loss_grad_scale, saved);
  return sums;
}

std::vector<moe::MoELayer*> GPTModel::moe_layers() const {
  std::vector<moe::MoELayer*> layers;
  for (const auto& block : decoder_)
    for (const auto& layer : block->layers())
      if (layer->moe()) layers.push_back(layer->moe());
  return layers;
}

void GPTModel::update_fp8_scales() const { tensor_parallel::update_fp8_scales(fp8_linears()); }

std::vector<tensor_parallel::Fp8Linear*> GPTModel::fp8_linears() const {
  std::vector<tensor_parallel::Fp8Linear*> layers;
  for (const auto& block : decoder_)
    for (const auto& layer : block->layers())
      for (tensor_parallel::Fp8Linear* fp8 : layer->fp8_linears()) layers.push_back(fp8);
  return layers;
}

void GPTModel::update_expert_bias() {
  std::vector<moe::Router*> routers;
  for (moe::MoELayer* layer : moe_layers())
    if (!layer->router().expert_bias().empty()) routers.push_back(&layer->router());
  if (routers.empty()) return;
  const auto E = int64_t(routers.front()->num_experts());
  Tensor counts = Tensor::empty({int64_t(routers.size()), E}, DType::f64);
  for (size_t r = 0; r < routers.size(); ++r) {
    const std::vector<double> loads = routers[r]->tokens_since_update();  // reads the device once per step
    for (int64_t e = 0; e < E; ++e) counts.set_item(int64_t(r) * E + e, loads[size_t(e)]);
  }
  if (ctx_->dp_cp->size() > 1) {
    Tensor on_device = counts.to(device_);
    ctx_->dp_cp->all_reduce(on_device, ReduceOp::sum);
    counts = on_device.to(Device::cpu());
  }
  for (size_t r = 0; r < routers.size(); ++r) {
    std::vector<double> global(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) global[size_t(e)] = counts.item(int64_t(r) * E + e);
    routers[r]->update_expert_bias(global);
  }
}

LossSums GPTModel::evaluate(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                            const Tensor& position_ids, const Tensor& segment_ids) {
  require_whole_model("evaluate");
  Saved saved;
  LossSums sums;
  stage_forward({tokens, labels, loss_mask, position_ids, segment_ids}, Tensor(), {.training = false}, saved,
                &sums);
  return sums;
}

Tensor GPTModel::logits(const Tensor& tokens, const Tensor& position_ids, const ForwardContext& fwd) {
  require_whole_model("logits");
  Saved saved;
  MicroBatch mb;
  mb.tokens = tokens;
  mb.position_ids = position_ids;
  const Tensor h = forward_layers(mb, Tensor(), fwd, saved);
  return output_forward(h, saved.output);
}

Tensor GPTModel::last_position_logits(const Tensor& tokens) { return gather_last_position(logits(tokens)); }

Tensor GPTModel::next_logits(const Tensor& tokens, KvCache& cache) {
  MEGATRON_CHECK(!ctx_->sequence_parallel(), "generation with a key/value cache runs without sequence parallelism");
  const int64_t B = tokens.dim(0), S = tokens.dim(1), L = cache.length;
  MEGATRON_CHECK(L + S <= config_.max_position_embeddings,
                 "positions up to " << L + S << " exceed max_position_embeddings " << config_.max_position_embeddings);
  Tensor positions = Tensor::empty({B, S}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) positions.data<int32_t>()[b * S + s] = int32_t(L + s);
  const Tensor all = logits(tokens, positions, {.training = false, .kv_cache = &cache});
  cache.length += S;
  return gather_last_position(all);
}

Tensor GPTModel::gather_last_position(const Tensor& all) const {
  const Tensor last = all.select(all.dim(0) - 1);  // (B,V/TP)
  const int64_t B = last.dim(0), tp = ctx_->tp_size();
  Tensor shards = Tensor::empty({tp, B, last.dim(1)}, last.dtype(), device_);
  ctx_->tp->all_gather(shards, last);
  // Rank r holds vocabulary columns [r*V/TP, (r+1)*V/TP): (TP,B,V/TP) -> (B,TP,V/TP) = (B,V).
  Tensor out = Tensor::empty({B, tp, last.dim(1)}, last.dtype(), device_);
  ops::transpose01(out, shards);
  return out.view({B, -1});
}

}  // namespace megatron
