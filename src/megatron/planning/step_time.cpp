#include "megatron/planning/step_time.h"

#include <algorithm>
#include <cstdio>

#include "megatron/core/dtype.h"
#include "megatron/optimizer/adamw_state.h"
#include "megatron/planning/op_throughputs.h"
#include "megatron/transformer/moe/moe_config.h"

namespace megatron::planning {

namespace {
// The share of layers that are MoE layers.
double moe_share(const TransformerConfig& c) {
  if (!c.moe.enabled()) return 0.0;
  std::string why;
  const std::vector<bool> pattern = moe_layer_pattern(c.moe.moe_layer_freq, c.num_layers, &why);
  return double(std::count(pattern.begin(), pattern.end(), true)) / double(c.num_layers);
}
}  // namespace

StepTime plan_step_time(const TrainingArgs& args) {
  const OpThroughputs& hw = kH100Throughputs;
  const TransformerConfig& c = args.model;
  const double tokens = double(args.global_batch_size) * double(c.seq_length);  // per step, all replicas
  const double H = double(c.hidden_size), F = double(c.ffn_hidden_size), L = double(c.num_layers);
  const double d = double(c.kv_channels), NH = double(c.num_attention_heads), G = double(c.num_query_groups);
  const double fc1 = c.swiglu ? 2.0 : 1.0;
  const double attention_params = H * (NH + 2 * G) * d + NH * d * H;
  // A MoE layer's tokens each pass through top-k experts (and the shared expert).
  const double moe = moe_share(c);
  const double dense_mlp_params = H * F * (fc1 + 1);
  double mlp_params = dense_mlp_params, stored_mlp_params = dense_mlp_params;
  if (moe > 0) {
    const double expert =
        H * double(c.moe.moe_ffn_hidden_size) * (fc1 + 1) * double(c.moe.moe_router_topk) +
        H * double(c.moe.moe_shared_expert_intermediate_size) * (fc1 + 1) + H * double(c.moe.num_moe_experts);
    mlp_params = (1 - moe) * dense_mlp_params + moe * expert;
    // Every expert's parameters are updated, not only the top-k a token uses.
    const double experts = H * double(c.moe.moe_ffn_hidden_size) * (fc1 + 1) * double(c.moe.num_moe_experts) +
                           H * double(c.moe.moe_shared_expert_intermediate_size) * (fc1 + 1);
    stored_mlp_params = (1 - moe) * dense_mlp_params + moe * experts;
  }
  const double layer_params = attention_params + mlp_params;
  // Forward 2 flops per parameter and token, backward 4; a full recompute runs the forward again,
  // selective recomputation the modules it names.
  double layer_passes = 6.0, attention_passes = 3.5;
  if (c.recompute.full()) {
    layer_passes += 2.0;
    attention_passes += 1.0;
  } else {
    if (c.recompute.recomputes("core_attn")) attention_passes += 1.0;
  }
  double gemm_flops = tokens * (layer_passes * L * layer_params + 6.0 * H * double(c.padded_vocab_size));
  if (!c.recompute.full() && c.recompute.recomputes("mlp")) gemm_flops += tokens * L * 2.0 * H * F * fc1;
  // Causal: half of the 2 x 2 x S x S x NH x d of QK^T and PV per sequence.
  const double attention_flops = attention_passes * L * 2.0 * tokens * double(c.seq_length) * NH * d;
  const double e = double(dtype_size(c.params_dtype));
  double elementwise_bytes = tokens * L * (H + F) * e * hw.elementwise_passes;
  // layernorm recompute: each layer's two norms read their input and write their output again.
  if (!c.recompute.full() && c.recompute.recomputes("layernorm")) elementwise_bytes += tokens * L * 4.0 * H * e;
  const double ranks = double(args.world_size);

  StepTime t;
  t.device = hw.device;
  t.gemm_ms = 1e3 * gemm_flops / ranks / (hw.gemm_tflops * 1e12);
  t.attention_ms = 1e3 * attention_flops / ranks / (hw.attention_tflops * 1e12);
  t.elementwise_ms = 1e3 * elementwise_bytes / ranks / (hw.hbm_tbps * 1e12);
  // Every rank updates its share of the parameters (model-parallel split; DP shard with the
  // distributed optimizer).
  const double params = L * (attention_params + stored_mlp_params) + 2 * H * double(c.padded_vocab_size);
  const double model_parallel = double(args.parallel.tensor_model_parallel_size * args.parallel.pipeline_model_parallel_size);
  const double dp = double(args.data_parallel_size * args.parallel.context_parallel_size);
  const double params_per_rank = params / model_parallel / (args.use_distributed_optimizer ? dp : 1.0);
  // With offload (optimizer/adamw_state.h) the device updates its share on the compute stream while
  // the host updates the offloaded chunks and the copy stream carries their fp32 gradients down and
  // parameters up, one direction at a time: the slowest of the three counts, plus the first chunk's
  // copy down and the last one's copy up, which nothing overlaps.
  const double offloaded = args.optimizer.optimizer_cpu_offload ? args.optimizer.optimizer_offload_fraction : 0.0;
  const double offloaded_elements = params_per_rank * offloaded;
  // AdamW's bytes an element on the device: f32 gradient, master and moments read, master, moments
  // and the 16-bit weight written (30); masters as remainders beside bf16 weights read and write the
  // weight and a 16-bit remainder instead of the f32 master (28).
  const double adamw_bytes = args.optimizer.keeps_param_remainders(c.params_dtype) ? 28.0 : 30.0;
  const double device_update = params_per_rank * (1.0 - offloaded) * adamw_bytes / (hw.adamw_tbps * 1e12);
  const double host_update = offloaded_elements * 30.0 / (hw.host_adamw_gbps * 1e9);
  const double copy_per_element = (4.0 + e) / (hw.pcie_gbps * 1e9);
  const double unoverlapped =
      std::min(offloaded_elements, double(AdamWStateOptions{}.chunk_elements)) * copy_per_element;
  t.optimizer_ms =
      1e3 * (std::max({device_update, host_update, offloaded_elements * copy_per_element}) + unoverlapped);
  // Gradient all-reduce (fp32) over DP, exposed unless overlapped with backward; TP's per-layer
  // collectives (4 per layer forward and backward of the (S,B,H) stream), exposed.
  const double link = hw.link_gbps * 1e9;
  if (dp > 1 && !args.overlap_grad_reduce)
    t.communication_ms += 1e3 * 4.0 * (params / model_parallel) * 2.0 * (dp - 1) / dp / link;
  const double tp = double(args.parallel.tensor_model_parallel_size);
  if (tp > 1)
    t.communication_ms += 1e3 * (tokens / dp) * L / double(args.parallel.pipeline_model_parallel_size) * 8.0 * H * e *
                          (tp - 1) / tp / link;
  const int64_t pp = args.parallel.pipeline_model_parallel_size;
  const int64_t virtual_stages = args.parallel.num_virtual_stages_per_pipeline_rank.value_or(1);
  t.bubble_fraction = pp > 1 ? double(pp - 1) / double(args.num_micro_batches() * virtual_stages) : 0.0;
  t.host_gap_factor = hw.host_gap_factor;
  const double compute = (t.gemm_ms + t.attention_ms + t.elementwise_ms) * (1.0 + t.bubble_fraction);
  t.step_ms = (compute + t.optimizer_ms + t.communication_ms) * t.host_gap_factor;
  t.tokens_per_second_per_rank = tokens / ranks / (t.step_ms * 1e-3);
  return t;
}

std::string format_step_time(const StepTime& t) {
  char text[640];
  std::snprintf(text, sizeof text,
                "expected step time on %s: %.1f ms (GEMMs %.1f, attention %.1f, elementwise %.1f, optimizer %.1f, "
                "exposed communication %.1f; pipeline bubble %.1f%%, host gaps x%.3f), %.0f tokens/s per GPU\n"
                "  (throughputs measured by this engine: src/megatron/planning/op_throughputs.h)\n",
                t.device, t.step_ms, t.gemm_ms, t.attention_ms, t.elementwise_ms, t.optimizer_ms, t.communication_ms,
                100.0 * t.bubble_fraction, t.host_gap_factor, t.tokens_per_second_per_rank);
  return text;
}

}  // namespace megatron::planning
