#include "megatron/transformer/attention.h"

#include <cmath>

#include "megatron/context_parallel/all_to_all_attention.h"
#include "megatron/context_parallel/load_balance.h"
#include "megatron/context_parallel/ring_attention.h"
#include "megatron/ops/elementwise.h"

namespace megatron {

namespace {
int64_t qkv_size(const TransformerConfig& c) {
  return (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels;
}
float output_init_std(const TransformerConfig& c) {
  return c.init_method_std / std::sqrt(2.0f * float(c.num_layers));  // Megatron's scaled init for projections
}
}  // namespace

// The fused QKV rows are group-major ([q heads of group 0; k; v], [group 1] ...), so a contiguous
// split of the rows gives each rank whole query groups: the groups must divide across TP. Checked
// before any parameter is registered, with the fix.
int64_t SelfAttention::query_groups_per_rank(const TransformerConfig& c, int tp) {
  MEGATRON_CHECK(c.num_query_groups % tp == 0,
                 "--num-query-groups " << c.num_query_groups << " is not divisible by --tensor-model-parallel-size "
                                       << tp << ": each TP rank holds whole query groups (key/value heads); use a TP "
                                       << "that divides " << c.num_query_groups << ", or more query groups");
  return c.num_query_groups / tp;
}

SelfAttention::SelfAttention(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
                             const std::string& prefix, const std::optional<ops::Fp8Recipe>& fp8)
    : prefix_(prefix),
      heads_local_(config.num_attention_heads / ctx.tp_size()),
      total_heads_(config.num_attention_heads),
      head_offset_(heads_local_ * ctx.tp_rank()),
      groups_local_(query_groups_per_rank(config, ctx.tp_size())),
      head_dim_(config.kv_channels),
      attention_dropout_(config.attention_dropout),
      rope_(config.position_embedding_type == PositionEmbeddingType::rope),
      window_(config.window_size_left),
      deterministic_(config.deterministic_mode),
      recompute_(config.recompute.recomputes("core_attn")),
      rope_params_{.base = config.rotary_base,
                   .percent = config.rotary_percent,
                   .interleaved = config.rotary_interleaved,
                   .scaling_factor = config.use_rope_scaling ? config.rope_scaling_factor : 0.0f,
                   .seq_len_interpolation_factor = float(config.rotary_seq_len_interpolation_factor.value_or(1))},
      cp_(ctx.cp && ctx.cp->size() > 1 ? ctx.cp : nullptr),
      cp_comm_type_(ctx.cp_comm_type),
      cp_a2a_(ctx.cp_a2a),
      cp_p2p_(ctx.cp_p2p),
      linear_qkv_(registry, ctx, prefix + ".linear_qkv", config.hidden_size, qkv_size(config),
                  {.bias = config.add_bias_linear || config.add_qkv_bias,
                   .init_std = config.init_method_std,
                   .fp8 = fp8,
                   .fp8_param = fp8 && config.fp8.fp8_param_gather}),
      linear_proj_(registry, ctx, prefix + ".linear_proj", config.num_attention_heads * config.kv_channels,
                   config.hidden_size,
                   {.bias = config.add_bias_linear,
                    .init_std = output_init_std(config),
                    .fp8 = fp8,
                    .fp8_param = fp8 && config.fp8.fp8_param_gather}) {
  if (config.qk_layernorm) {
    // Each TP rank normalises its own heads, so each holds part of the weights' gradient.
    const Norm::Rows head{.width = config.kv_channels, .partial_over_tp = true};
    q_layernorm_ =
        std::make_unique<Norm>(registry, config, prefix + ".q_layernorm.weight", prefix + ".q_layernorm.bias", head);
    k_layernorm_ =
        std::make_unique<Norm>(registry, config, prefix + ".k_layernorm.weight", prefix + ".k_layernorm.bias", head);
  }
}

std::vector<tensor_parallel::Fp8Linear*> SelfAttention::fp8_linears() const {
  std::vector<tensor_parallel::Fp8Linear*> layers;
  for (tensor_parallel::Fp8Linear* fp8 : {linear_qkv_.fp8(), linear_proj_.fp8()})
    if (fp8 != nullptr) layers.push_back(fp8);
  return layers;
}

void SelfAttention::Saved::count(ActivationMemory& m) const {
  qkv.count(m);
  for (const Tensor* t : {&q, &k, &v, &fused, &out, &lse}) m.add(*t);
  q_norm.count(m);
  k_norm.count(m);
  proj.count(m);  // its input is `out`, counted once
}

Tensor SelfAttention::forward(const Tensor& x, const ForwardContext& fwd, Saved& saved) const {
  const Tensor projected = linear_qkv_.forward(x, saved.qkv);         // (S,B,...): the whole sequence under SP too
  if (saved.qkv.input_t.codes.defined()) saved.qkv.input = Tensor();  // backward reads the FP8 cast of x^T
  return attend(projected, fwd, saved);
}

Tensor SelfAttention::forward(const tensor_parallel::Fp8Activation& x, const ForwardContext& fwd, Saved& saved) const {
  return attend(linear_qkv_.forward(x, saved.qkv), fwd, saved);
}

Tensor SelfAttention::attend(const Tensor& projected, const ForwardContext& fwd, Saved& saved) const {
  const int64_t S = projected.dim(0), B = projected.dim(1);
  const Tensor qkv = projected.view({S, B, groups_local_, -1});
  saved.attention = {.causal = true,
                     .softmax_scale = 1.0f / std::sqrt(float(head_dim_)),
                     .dropout_p = fwd.dropout_p(attention_dropout_),
                     .seed = fwd.seed,
                     .stream = fwd.random_stream(prefix_ + ".core_attention"),
                     .head_offset = head_offset_,
                     .total_heads = total_heads_,
                     .segment_ids = fwd.segment_ids,
                     .cu_seqlens = fwd.cu_seqlens,
                     .window = window_,
                     .max_seqlen = fwd.max_seqlen,
                     .deterministic = deterministic_};
  if (fwd.kv_cache) return forward_cached(qkv, fwd, saved);
  if (!cp_ && !q_layernorm_) {
    // q, k, v read in place from the projection where the backend can; RoPE turns its query and
    // key heads in place (the projection's output is this layer's own, kept for nothing else).
    saved.fused = qkv;
    if (rope_) ops::rope_forward_qkv(saved.fused, heads_local_, rope_params_);
  } else {
    ops::SplitQkv split = ops::empty_split_qkv(qkv, heads_local_);
    saved.q = split.q;
    saved.k = split.k;
    saved.v = split.v;
    ops::qkv_split(saved.q, saved.k, saved.v, qkv);
    if (q_layernorm_) normalize_heads(saved.q, saved.k, saved.q_norm, saved.k_norm);
    if (rope_) {
      rotate(saved.q, false);
      rotate(saved.k, false);
    }
  }
  core_attention(saved);
  const Tensor y = linear_proj_.forward(saved.out.view({S, B, -1}), saved.proj);
  if (recompute_) {
    saved.out = saved.lse = Tensor();
    saved.proj = {};
  }
  return y;
}

// Core attention over the whole sequence: the op, or under context parallelism the ring or the
// all-to-all, all with the op's contract.
void SelfAttention::core_attention(Saved& saved) const {
  const Tensor& like = saved.fused.defined() ? saved.fused : saved.q;  // (S,B,...)
  const int64_t S = like.dim(0), B = like.dim(1);
  saved.out = Tensor::empty({S, B, heads_local_, head_dim_}, like.dtype(), like.device());
  saved.lse = Tensor::empty({B, heads_local_, S}, like.dtype() == DType::f64 ? DType::f64 : DType::f32, like.device());
  if (saved.fused.defined())
    ops::attention_forward_qkv(saved.out, saved.lse, saved.fused, heads_local_, saved.attention);
  else if (cp_ && cp_comm_type_ == CpCommType::a2a)
    context_parallel::all_to_all_attention_forward(saved.out, saved.lse, saved.q, saved.k, saved.v, saved.attention,
                                                   *cp_);
  else if (cp_ && cp_comm_type_ == CpCommType::a2a_p2p)
    context_parallel::hierarchical_attention_forward(saved.out, saved.lse, saved.q, saved.k, saved.v, saved.attention,
                                                     *cp_a2a_, *cp_p2p_);
  else if (cp_ && cp_comm_type_ == CpCommType::allgather)
    context_parallel::all_gather_attention_forward(saved.out, saved.lse, saved.q, saved.k, saved.v, saved.attention,
                                                   *cp_);
  else if (cp_)
    context_parallel::ring_attention_forward(saved.out, saved.lse, saved.q, saved.k, saved.v, saved.attention, *cp_);
  else
    ops::attention_forward(saved.out, saved.lse, saved.q, saved.k, saved.v, saved.attention);
}

void SelfAttention::core_attention_backward(ops::SplitQkv& d, const Tensor& dout, const Saved& saved) const {
  if (cp_ && cp_comm_type_ == CpCommType::a2a)
    return context_parallel::all_to_all_attention_backward(d.q, d.k, d.v, dout, saved.q, saved.k, saved.v, saved.out,
                                                           saved.lse, saved.attention, *cp_);
  if (cp_ && cp_comm_type_ == CpCommType::a2a_p2p)
    return context_parallel::hierarchical_attention_backward(d.q, d.k, d.v, dout, saved.q, saved.k, saved.v, saved.out,
                                                             saved.lse, saved.attention, *cp_a2a_, *cp_p2p_);
  if (cp_ && cp_comm_type_ == CpCommType::allgather)
    return context_parallel::all_gather_attention_backward(d.q, d.k, d.v, dout, saved.q, saved.k, saved.v, saved.out,
                                                           saved.lse, saved.attention, *cp_);
  if (cp_)
    return context_parallel::ring_attention_backward(d.q, d.k, d.v, dout, saved.q, saved.k, saved.v, saved.out,
                                                     saved.lse, saved.attention, *cp_);
  ops::attention_backward(d.q, d.k, d.v, dout, saved.q, saved.k, saved.v, saved.out, saved.lse, saved.attention);
}

// The whole sequence from position 0, or the two CP chunks' true positions. `inverse`: the backward
// rotation.
void SelfAttention::rotate(Tensor& x, bool inverse) const {
  const auto turn = [&](Tensor& rows, int64_t first_position) {
    ops::RopeParams at = rope_params_;
    at.position_offset = first_position;
    inverse ? ops::rope_backward(rows, rows, at) : ops::rope_forward(rows, rows, at);
  };
  if (!cp_) return turn(x, 0);
  const context_parallel::CpChunks c = context_parallel::cp_chunks(x.dim(0) * cp_->size(), cp_->size(), cp_->rank());
  for (int half = 0; half < 2; ++half) {
    Tensor rows = x.slice(half * c.length, (half + 1) * c.length);
    turn(rows, c.start(half));
  }
}

void SelfAttention::normalize_heads(Tensor& q, Tensor& k, Norm::Saved& saved_q, Norm::Saved& saved_k) const {
  q = q_layernorm_->forward(ResidualStream{q, Tensor()}, saved_q);
  k = k_layernorm_->forward(ResidualStream{k, Tensor()}, saved_k);
}

// The new queries sit at rows [L, L + S) of a query tensor over all L + S positions, whose rows
// before L are zero and their outputs unused: the causal attention op then gives each new query
// exactly the keys it sees, cached and new, with the model's window. The work is (L + S)^2 per
// layer instead of S, negligible beside the projections and the MLP a full recompute would redo.
Tensor SelfAttention::forward_cached(const Tensor& qkv, const ForwardContext& fwd, Saved& saved) const {
  MEGATRON_CHECK(!cp_,
                 "generation with a key/value cache runs without context parallelism; "
                 "use --context-parallel-size 1");
  KvCache& cache = *fwd.kv_cache;
  const int64_t S = qkv.dim(0), B = qkv.dim(1), L = cache.length, T = L + S;
  const ops::SplitQkv split = ops::empty_split_qkv(qkv, heads_local_);
  Tensor q = split.q, k = split.k, v = split.v;
  ops::qkv_split(q, k, v, qkv);
  if (q_layernorm_) {
    Norm::Saved for_no_backward_q, for_no_backward_k;
    normalize_heads(q, k, for_no_backward_q, for_no_backward_k);
  }
  if (rope_) {
    ops::RopeParams at_offset = rope_params_;
    at_offset.position_offset = L;
    ops::rope_forward(q, q, at_offset);
    ops::rope_forward(k, k, at_offset);
  }
  KvCache::Entry& entry = cache.entry(prefix_, k);
  Tensor k_new = entry.k.slice(L, T), v_new = entry.v.slice(L, T);
  ops::cast(k_new, k);
  ops::cast(v_new, v);
  Tensor q_all = Tensor::zeros({T, B, heads_local_, head_dim_}, q.dtype(), q.device());
  Tensor q_new = q_all.slice(L, T);
  ops::cast(q_new, q);
  Tensor out = Tensor::empty(q_all.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({B, heads_local_, T}, q.dtype() == DType::f64 ? DType::f64 : DType::f32, q.device());
  ops::attention_forward(out, lse, q_all, entry.k.slice(0, T), entry.v.slice(0, T), saved.attention);
  return linear_proj_.forward(out.slice(L, T).view({S, B, -1}), saved.proj);
}

Tensor SelfAttention::backward(const Tensor& dy, const Saved& given) const {
  Saved recomputed;
  if (recompute_) {
    recomputed = given;
    core_attention(recomputed);
    recomputed.proj.input = recomputed.out.view({recomputed.out.dim(0), recomputed.out.dim(1), -1});
  }
  const Saved& saved = recompute_ ? recomputed : given;
  const Tensor dout = linear_proj_.backward(dy, saved.proj).view(saved.out.shape());
  const int64_t S = saved.out.dim(0), B = saved.out.dim(1);  // the whole sequence, also when dy is an SP shard
  Tensor dqkv =
      Tensor::empty({S, B, groups_local_, (heads_local_ / groups_local_ + 2) * head_dim_}, dy.dtype(), dy.device());
  if (saved.fused.defined()) {
    ops::attention_backward_qkv(dqkv, dout, saved.fused, saved.out, saved.lse, heads_local_, saved.attention);
    if (rope_ && linear_qkv_.takes_fp8_grad_output()) {
      // RoPE's backward writes the projection's output gradient as the FP8 casts its backward reads.
      const int64_t width = dqkv.numel() / (S * B);
      const tensor_parallel::Fp8Activation d{
          {S, B, width},
          dqkv.dtype(),
          linear_qkv_.fp8()->cast_grad_output(
              S * B, width, dqkv.device(), [&](Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale) {
                ops::rope_backward_qkv_fp8(q, q_t, amax, dqkv, heads_local_, rope_params_, scale);
              })};
      return linear_qkv_.backward(d, saved.qkv);
    }
    if (rope_) ops::rope_backward_qkv(dqkv, heads_local_, rope_params_);
    return linear_qkv_.backward(dqkv.view({S, B, -1}), saved.qkv);
  }
  ops::SplitQkv d = ops::empty_split_qkv(dqkv, heads_local_);
  core_attention_backward(d, dout, saved);
  if (rope_) {
    rotate(d.q, true);
    rotate(d.k, true);
  }
  if (q_layernorm_) {
    d.q = q_layernorm_->backward(d.q, saved.q_norm);
    d.k = k_layernorm_->backward(d.k, saved.k_norm);
  }
  ops::qkv_merge(dqkv, d.q, d.k, d.v);
  return linear_qkv_.backward(dqkv.view({S, B, -1}), saved.qkv);
}

}  // namespace megatron
