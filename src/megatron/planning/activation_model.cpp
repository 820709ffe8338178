#include "megatron/planning/activation_model.h"

#include <algorithm>

#include "megatron/core/dtype.h"
#include "megatron/core/error.h"
#include "megatron/transformer/moe/moe_config.h"
#include "megatron/transformer/recompute_config.h"

namespace megatron::planning {

namespace {

// The sizes a layer's tensors are made of, for one micro-batch on one rank.
struct LayerDims {
  int64_t T, Ts;          // tokens; tokens of the residual stream (T / TP under SP)
  int64_t H;              // hidden
  int64_t heads, groups;  // this rank's query heads and query groups
  int64_t head_dim;
  int64_t qkv;           // width of the fused projection: groups x (heads/groups + 2) x head_dim
  int64_t ffn;           // this rank's MLP width (before SwiGLU's doubling)
  int64_t fc1_factor;    // 2 with SwiGLU ([gate; up]), else 1
  int64_t e;             // bytes of an activation element (the params dtype)
  int64_t stats;         // bytes of a norm statistic, an lse or a routing weight: f32 (f64 runs: f64)
  bool layer_norm;       // LayerNorm keeps a mean beside rstd
  bool qk_norm;          // --qk-layernorm: the query and key heads normalised, q, k, v split out
  bool fused_attention;  // q, k, v read in place from the projection (RoPE turns it in place): no CP, no qk_norm
  bool dropout;          // hidden dropout in training: its gradient is a new tensor
  bool recompute_core_attn, recompute_mlp, recompute_moe_act, recompute_layernorm;
  bool sequence_parallel, tp_comm_overlap;
};

LayerDims layer_dims(const TransformerConfig& c, const ActivationShape& s) {
  LayerDims d{};
  d.T = s.tokens();
  d.Ts = s.stream_tokens();
  d.H = c.hidden_size;
  d.heads = c.num_attention_heads / s.tp;
  d.groups = c.num_query_groups / s.tp;
  d.head_dim = c.kv_channels;
  d.qkv = d.groups * (d.heads / d.groups + 2) * d.head_dim;
  d.ffn = c.ffn_hidden_size / s.tp;
  d.fc1_factor = c.swiglu ? 2 : 1;
  d.e = int64_t(dtype_size(c.params_dtype));
  d.stats = c.params_dtype == DType::f64 ? 8 : 4;
  d.layer_norm = c.normalization == Normalization::LayerNorm;
  d.qk_norm = c.qk_layernorm;
  d.fused_attention = !s.context_parallel && !d.qk_norm;
  d.dropout = c.hidden_dropout > 0.0f;
  d.recompute_core_attn = c.recompute.recomputes("core_attn");
  d.recompute_mlp = c.recompute.recomputes("mlp");
  d.recompute_moe_act = c.recompute.recomputes("moe_act");
  d.recompute_layernorm = c.recompute.recomputes("layernorm");
  d.sequence_parallel = s.sequence_parallel;
  d.tp_comm_overlap = s.tp_comm_overlap;
  return d;
}

// FP8 layers keep the forward's cast of a linear layer's x^T (a byte an element) for its backward
// (tensor_parallel::LinearSaved::input_t): column-parallel layers where their whole input is at
// hand (no SP), row-parallel ones unless --tp-comm-overlap chunks them. Where it is kept the owner
// drops the bf16 input (the QKV projection's, fc1's unless mlp is recomputed).
bool keeps_column_cast(const LayerDims& d, bool fp8) { return fp8 && !d.sequence_parallel; }
bool keeps_row_cast(const LayerDims& d, bool fp8) { return fp8 && !d.tp_comm_overlap; }

// A norm keeps its input (the residual sum) and its statistics.
int64_t norm_saved(const LayerDims& d) { return d.Ts * d.H * d.e + d.Ts * d.stats * (d.layer_norm ? 2 : 1); }

// A column-parallel layer's input from a norm: its FP8 cast where kept, else the bf16 norm output
// unless layernorm recompute drops it (TransformerLayer rebuilds it in backward).
int64_t norm_output_kept(const LayerDims& d, bool fp8) {
  if (keeps_column_cast(d, fp8)) return d.T * d.H;
  return d.recompute_layernorm ? 0 : d.Ts * d.H * d.e;
}

// SelfAttention::Saved: the projection's input (or its FP8 cast), q, k and v (or the fused
// projection), the q/k norms' inputs and statistics, the op's output and lse (unless core_attn is
// recomputed; the output projection's input is that output, and its FP8 cast beside it).
int64_t attention_saved(const LayerDims& d, bool fp8) {
  int64_t bytes = norm_output_kept(d, fp8) + d.T * d.qkv * d.e;
  if (d.qk_norm) {
    const int64_t heads = d.T * (d.heads + d.groups);
    bytes += heads * d.head_dim * d.e + heads * d.stats * (d.layer_norm ? 2 : 1);
  }
  if (!d.recompute_core_attn) {
    bytes += d.T * d.heads * d.head_dim * d.e + d.T * d.heads * d.stats;
    if (keeps_row_cast(d, fp8)) bytes += d.T * d.heads * d.head_dim;
  }
  return bytes;
}

// MLP::Saved: fc1's input and output (fc2's input is rebuilt from fc1's output; with mlp recomputed,
// fc1's output too). In FP8 without recompute: the casts of fc1's input (in place of it) and of
// fc2's input (in place of rebuilding it).
int64_t mlp_saved(const LayerDims& d, int64_t ffn, bool saves_input = true, bool fp8 = false) {
  if (d.recompute_mlp) return saves_input && !d.recompute_layernorm ? d.Ts * d.H * d.e : 0;
  int64_t bytes = d.T * ffn * d.fc1_factor * d.e;
  if (saves_input) bytes += norm_output_kept(d, fp8);
  if (keeps_row_cast(d, fp8)) bytes += d.T * ffn;
  return bytes;
}

// The rows a rank's experts see: each of the group's tokens' top-k choices, spread evenly over EP.
int64_t expert_rows(const MoEConfig& moe, const LayerDims& d) { return d.Ts * moe.moe_router_topk; }

// MoELayer::Saved (the allgather dispatcher): the router's input, in the router's dtype (f32, f64 in
// f64 runs: a 16-bit run keeps an f32 copy of it) (and, routing on the device: one rank of experts,
// dropless, its logits and top-k choices; the probabilities are the plan's), the dispatch plan (row
// indices and weights, the (T,E) row map and probabilities, over the EP group's tokens), the
// experts' input, fc1 output and activation output (unless moe_act is recomputed), their output,
// and the shared expert's MLP, with its gate the MLP's output and the sigmoid per token.
int64_t moe_saved(const MoEConfig& moe, const LayerDims& d, int64_t ep, int64_t expert_tp) {
  const int64_t N = expert_rows(moe, d), E = moe.num_moe_experts, group_tokens = d.Ts * ep;
  int64_t bytes = d.Ts * d.H * d.stats;
  // The router routes on the device unless the expert TP x EP group exchanges tokens (or capacity
  // drops them): MoELayer's exchange.
  const bool device_routing = ep * expert_tp == 1 && !moe.moe_expert_capacity_factor.has_value();
  if (device_routing) bytes += d.Ts * E * d.stats + d.Ts * moe.moe_router_topk * 4;
  bytes += N * (4 + d.stats) + group_tokens * E * (4 + d.stats);
  bytes += N * d.H * d.e + N * moe.moe_ffn_hidden_size * d.fc1_factor * d.e + N * d.H * d.e;
  if (!d.recompute_moe_act) bytes += N * moe.moe_ffn_hidden_size * d.e;
  // The shared expert's MLP keeps the layer's input (whatever the layernorm recompute): the router's
  // own in f32 and f64 runs, beside the router's f32 copy in 16-bit ones.
  if (moe.moe_shared_expert_intermediate_size > 0) {
    bytes += mlp_saved(d, moe.moe_shared_expert_intermediate_size, false);
    if (d.e != d.stats) bytes += d.Ts * d.H * d.e;
  }
  if (moe.moe_shared_expert_gate) bytes += d.Ts * d.H * d.e + d.Ts * d.stats;  // the gated output, the sigmoid
  return bytes;
}

// The tensors a layer's backward holds at once, beyond the saved ones, at the larger of its two
// phases. Both hold the incoming gradient, and dropout's gradient beside it.
//   MLP: the activation rebuilt for fc2 (by the experts only under moe_act), fc2's input
//     gradient, fc1's output gradient and fc1's input gradient (T rows before an SP
//     reduce-scatter); fc1's output again when mlp is recomputed. FP8 keeps the same at the larger
//     phase: fc2's input is not rebuilt (its cast is kept), and fc1's output gradient under the
//     delayed recipe is its two casts, as many bytes as bf16.
//   attention: dh and its dropout gradient, the output projection's input gradient, dqkv and the
//     split q, k, v gradients (and, where the fused op splits by definition, the split q, k, v
//     themselves: on the CPU, and on CUDA unless cuDNN reads the MHA layout in place); the op's
//     output and lse again when core_attn is recomputed; the q/k norms' input gradients beside
//     the gradients they read.
//   Both: the norm's output rebuilt when layernorm is recomputed.
int64_t layer_backward_working(const TransformerConfig& c, bool moe_layer, const LayerDims& d, const ActivationShape& s,
                               PlanBackend backend) {
  const int64_t stream = d.Ts * d.H * d.e, full = d.T * d.H * d.e;
  // Under SP a column-parallel backward gathers its input's sequence again (T rows).
  const int64_t incoming = stream + (d.dropout ? stream : 0) + (s.sequence_parallel ? full : 0);
  int64_t mlp = 0;
  if (moe_layer) {
    const int64_t N = expert_rows(c.moe, d), F = c.moe.moe_ffn_hidden_size;
    mlp = 2 * N * d.H * d.e + N * F * (1 + d.fc1_factor) * d.e + full + (d.recompute_moe_act ? N * F * d.e : 0);
  } else {
    const int64_t act = d.T * d.ffn * d.e, fc1 = d.T * d.ffn * d.fc1_factor * d.e;
    mlp = (c.swiglu ? act + fc1 + full : std::max(2 * act, act + full)) + (d.recompute_mlp ? fc1 : 0);
  }
  // layernorm recompute rebuilds a norm's output for the phase that reads it (an MoE layer keeps its
  // MLP input; counted without telling whether an FP8 layer kept a cast instead).
  const int64_t rebuilt = d.recompute_layernorm ? stream : 0;
  if (!moe_layer) mlp += rebuilt;
  const int64_t out = d.T * d.heads * d.head_dim * d.e;
  const bool in_place = d.fused_attention && backend == PlanBackend::cuda && d.groups == d.heads;
  const int64_t splits = in_place ? 0 : d.fused_attention ? 2 : 1;
  int64_t attention = stream + (d.dropout ? stream : 0) + out + d.T * d.qkv * d.e * (1 + splits);
  if (d.recompute_core_attn) attention += out + d.T * d.heads * d.stats;
  if (d.qk_norm) attention += d.T * (d.heads + d.groups) * d.head_dim * d.e;
  attention += rebuilt;
  return incoming + std::max(mlp, attention);
}

}  // namespace

int64_t ChunkActivations::counted() const {
  int64_t bytes = checkpoints + embedding + final_norm_and_loss;
  for (const LayerMemory& l : layers) bytes += l.saved;
  return bytes;
}

ChunkActivations chunk_activations(const TransformerConfig& config, const pipeline_parallel::StageLayers& stage,
                                   const ActivationShape& shape, PlanBackend backend) {
  const LayerDims d = layer_dims(config, shape);
  std::string why;
  const std::vector<bool> moe = config.moe.enabled()
                                    ? moe_layer_pattern(config.moe.moe_layer_freq, config.num_layers, &why)
                                    : std::vector<bool>(size_t(config.num_layers), false);
  MEGATRON_CHECK(why.empty(), "--moe-layer-freq " << config.moe.moe_layer_freq << ": " << why);
  ChunkActivations a;
  const int64_t stream = d.Ts * d.H * d.e;
  for (int64_t i = stage.first_layer; i < stage.first_layer + stage.num_layers; ++i) {
    const bool is_moe = moe[size_t(i)];
    const bool fp8 = config.fp8.enabled() && config.fp8.layer_in_fp8(i, config.num_layers);
    const int64_t saved =
        2 * norm_saved(d) + attention_saved(d, fp8) +
        (is_moe ? moe_saved(config.moe, d, shape.ep, shape.expert_tp) : mlp_saved(d, d.ffn, true, fp8));
    a.layers.push_back({saved, layer_backward_working(config, is_moe, d, shape, backend)});
  }
  // Full recomputation (the engine's own segments): a checkpointed segment's layers keep nothing
  // but its input stream, both halves unless the residual half is the norm input a kept layer
  // before it saved (or the stage's input, the first layer's).
  const std::vector<LayerSegment> segments = recompute_segments(config.recompute, stage.num_layers);
  for (size_t k = 0; k < segments.size(); ++k) {
    const LayerSegment& seg = segments[k];
    if (!seg.checkpointed) continue;
    // Backward reruns the segment's forward: its layers' saved tensors exist again, all at once,
    // while the segment's backward runs.
    int64_t rerun = 0;
    for (int64_t i = seg.begin; i < seg.end; ++i) rerun += a.layers[size_t(i)].saved;
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      a.layers[size_t(i)].saved = 0;
      a.layers[size_t(i)].backward_working += rerun;
    }
    a.checkpoints += k == 0 || !segments[k - 1].checkpointed ? stream : 2 * stream;
  }
  const int64_t B = shape.micro_batch, S = shape.seq_length;
  if (stage.embedding) {
    if (config.position_embedding_type == PositionEmbeddingType::learned_absolute) a.embedding = 4 * d.Ts;
    a.inputs += 4 * B * S;  // token ids
  }
  if (stage.loss) {
    const int64_t vocab = config.padded_vocab_size / shape.tp;
    // The final norm belongs to the last layer's block: recomputed with it when that layer is.
    const bool last_layer_recomputed = !segments.empty() && segments.back().checkpointed;
    a.final_norm_and_loss = (last_layer_recomputed ? 0 : norm_saved(d)) + stream + d.T * vocab * d.e + d.T * d.stats;
    if (last_layer_recomputed) a.layers.back().backward_working += norm_saved(d);
    a.inputs += 2 * 4 * d.T;  // labels and loss mask, sequence-major
    // The output layer's input gradient; under SP also the gathered input its weight gradient reads
    // and the reduce-scattered result.
    a.loss_working = d.T * d.H * d.e + (shape.sequence_parallel ? d.T * d.H * d.e + stream : 0);
  }
  return a;
}

}  // namespace megatron::planning
