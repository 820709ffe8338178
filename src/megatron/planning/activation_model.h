#pragma once
// The activation memory of one micro-batch, worked out from the model's shapes without running it:
// the bytes each module's Saved struct keeps for backward (what GPTModel::activation_bytes counts
// after a forward, tested equal for every module kind, recompute setting and layout in
// tests/unit/test_plan_activations.cpp), and the gradients and copies a layer's backward holds at
// once on top of them (its working set), so a plan can say where a rank's memory peaks.
//
// Tokens per micro-batch T = (seq_length / CP) x micro_batch_size; under sequence parallelism the
// residual stream, the norms and the inputs of column-parallel layers hold T / TP of them. MoE layers
// are planned dropless: each token's top-k rows reach the experts (under expert parallelism, the
// average over the EP group; a skewed routing holds more on the busy rank). FP8 layers keep their
// linear layers' x^T casts (tensor_parallel/layers.h).
#include <cstdint>
#include <vector>

#include "megatron/pipeline_parallel/stage_split.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::planning {

// Which backend's kernels: they differ in the copies attention keeps while it runs.
enum class PlanBackend { cpu, cuda };

struct ActivationShape {
  int64_t seq_length = 0;      // this rank's share of a sequence (seq_length / CP)
  int64_t micro_batch = 0;     // B
  int64_t tp = 1;              // tensor-parallel size
  bool sequence_parallel = false;
  bool tp_comm_overlap = false;  // row-parallel GEMMs chunked along the sequence (FP8 keeps no casts there)
  int64_t ep = 1;              // expert-parallel size
  int64_t expert_tp = 1;       // expert tensor-parallel size (Megatron's default: tp)
  bool context_parallel = false;  // CP > 1: attention runs on split q, k, v
  int64_t tokens() const { return seq_length * micro_batch; }
  int64_t stream_tokens() const { return sequence_parallel ? tokens() / tp : tokens(); }
};

struct LayerMemory {
  int64_t saved = 0;           // bytes kept for backward (zero inside a fully recomputed segment)
  int64_t backward_working = 0;  // bytes its backward holds on top of everything saved, at its peak
};

// One micro-batch through one model chunk (a pipeline stage's layers, or the whole model).
struct ChunkActivations {
  std::vector<LayerMemory> layers;  // the chunk's layers, first first
  int64_t checkpoints = 0;          // inputs of fully recomputed segments
  int64_t embedding = 0;            // learned position ids
  int64_t final_norm_and_loss = 0;  // final norm, output layer input, logits, lse (last stage)
  int64_t inputs = 0;  // token ids, labels and loss mask on the device: not counted by the engine's report
  int64_t loss_working = 0;  // the loss's backward on top of the saved: the output layer's input gradient
  // What GPTModel::activation_bytes reports for this chunk.
  int64_t counted() const;
};

ChunkActivations chunk_activations(const TransformerConfig& config, const pipeline_parallel::StageLayers& stage,
                                   const ActivationShape& shape, PlanBackend backend);

}  // namespace megatron::planning
