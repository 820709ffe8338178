#pragma once
// A parameter and its metadata: the one source of truth (DESIGN principle 5). Each parameter is
// described once by its ParamSpec (Megatron name, global shape, TP split, init, weight decay);
// DDP buffers, the optimizer, checkpoint sharding and initialisation all read it. The registry
// that owns the parameters and their flat buffers is parameter_registry.h.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/fp8.h"

namespace megatron {

enum class InitMethod { normal, zeros, ones };

struct ParamSpec {
  std::string name;  // global Megatron name, e.g. decoder.layers.3.mlp.linear_fc1.weight
  Shape global_shape;
  int partition_dim = -1;  // dimension split across TP ranks; -1 = replicated
  // Independent blocks along partition_dim that are split separately (fused SwiGLU fc1 is
  // [gate; up]: 2 blocks, and rank t holds [gate_t; up_t]). 1 for ordinary layers.
  int64_t partition_blocks = 1;
  InitMethod init = InitMethod::normal;
  float init_std = 0.02f;
  bool weight_decay = true;        // false for biases and norm weights
  // The word embedding (either pipeline end's copy) and the output layer's weight: updated at
  // --decoupled-lr's learning rate when it is given (Megatron's is_embedding_or_output_parameter).
  bool embedding_or_output = false;
  // Replicated under TP, but each rank's gradient covers part of its use: a sequence shard under SP
  // (the norms, the position embedding, the router), its own heads (the q/k norms, which Megatron's
  // finalize_model_grads sums by name): summed over TP before the optimizer.
  bool sequence_parallel = false;
  // Dim 0 indexes MoE experts, split in contiguous ranges over the expert-parallel ranks (the
  // global tensor holds every expert by its global index); a TP split (expert tensor
  // parallelism) then cuts another dimension of each expert.
  bool expert_parallel = false;
  // The last pipeline stage's copy of the tied word embedding (its output layer's weight): kept
  // equal to the first stage's by summing the two gradients, so neither counted in the gradient
  // norm nor saved a second time (Megatron's shared_embedding).
  bool pipeline_copy = false;
  // The word embedding tied across pipeline stages, on either end (the first stage's embedding and
  // the last stage's copy; Megatron's shared_embedding): with the distributed optimizer in a DDP
  // bucket of its own, so both ends shard it alike, and summed over the embedding group after the
  // DP reduction (finalize_model_grads.h).
  bool shared_embedding = false;
  // The one module that writes this parameter's gradient writes the first one of a step over the
  // main grad instead of adding it (a linear layer's weight-gradient GEMM with beta 0), so
  // ParameterRegistry::zero_grads() leaves it: no memset of it each step, and that GEMM reads no
  // zeros.
  bool first_grad_overwrites = false;
};

// This TP rank's shape of the parameter `spec` describes: the global shape with partition_dim
// divided by tp_size (an error when it does not divide into partition_blocks x tp_size).
Shape tp_local_shape(const ParamSpec& spec, int tp_size);

struct Parameter {
  ParamSpec spec;
  size_t index = 0;  // registration order
  Shape local_shape;
  int tp_rank = 0;
  int tp_size = 1;
  int ep_rank = 0;  // of an expert-parallel parameter; 0 and 1 otherwise
  int ep_size = 1;
  Tensor data;                // compute copy (params dtype), view into the parameter buffer
  Tensor main_grad;           // accumulation buffer (f32, or f64), view into the gradient buffer
  int64_t buffer_offset = 0;  // element offset of this parameter in the flat buffers
  // --fp8-param-gather: the FP8 layer that owns this weight holds it as FP8 codes (Megatron's FP8
  // parameters), set before the layout is made. Once the distributed optimizer has cast it
  // (ParameterRegistry::split_params, distributed/fp8_params.h), `data` holds the codes in
  // scaling->dtype, standing for codes x scaling->scale_inv; until then the compute copy.
  struct Fp8Weight {
    ops::Fp8Recipe recipe;                     // delayed or current (tensorwise) scaling
    ops::Fp8TensorScaling* scaling = nullptr;  // the owning layer's weight state (Fp8Linear::weight_scaling)
  };
  std::optional<Fp8Weight> fp8;
  // Whether data holds FP8 codes now (an FP8 parameter the distributed optimizer has cast).
  bool held_in_fp8() const { return fp8 && data.defined() && dtype_is_fp8(data.dtype()); }
  // Set by ParameterRegistry::zero_grads() for a spec.first_grad_overwrites parameter in place of
  // zeroing main_grad: its next gradient overwrites main_grad (take_grad_overwrite()).
  bool grad_overwrite_pending = false;

  // Whether the gradient about to be written overwrites main_grad (once after zero_grads()) or
  // adds to it; for the module that writes it.
  bool take_grad_overwrite() { return std::exchange(grad_overwrite_pending, false); }

  // The part of a flat buffer (same layout as the parameter buffer) that belongs to this parameter.
  Tensor view_of(const Tensor& flat_buffer) const {
    return flat_buffer.slice(buffer_offset, buffer_offset + shape_numel(local_shape)).view(local_shape);
  }

  // A copy of a parameter another rank holds and counts: a replicated parameter on a TP rank other
  // than 0 (a copy of TP rank 0's), or a pipeline copy. Such copies are not counted again in the
  // gradient norm and not saved again (Megatron's param_is_not_tensor_parallel_duplicate and
  // param_is_not_shared, negated).
  bool is_duplicate() const { return (spec.partition_dim < 0 && tp_rank != 0) || spec.pipeline_copy; }

  // Global index along dim 0 of this shard's first row: its first expert under expert
  // parallelism, 0 otherwise.
  int64_t expert_offset() const { return spec.expert_parallel ? int64_t(ep_rank) * local_shape[0] : 0; }

  // The global coordinate along `dim` of local coordinate `local_coord`: shifted by the expert
  // offset (dim 0) and placed in its TP block (the partition dimension).
  int64_t global_coordinate(size_t dim, int64_t local_coord) const;
  // Index into the global tensor of local element `local_index` (row-major): how a shard
  // initialises exactly the values the full tensor would hold there.
  int64_t global_index(int64_t local_index) const;
  // For checkpoints: the local tensor as one or more slices of the global tensor. Element
  // offsets per dim; one entry per partition block.
  struct Slice {
    Shape global_offset;
    Tensor local;
  };
  std::vector<Slice> global_slices() const { return global_slices_of(data); }
  // The same slicing applied to another tensor of the local shape (main grad, optimizer state).
  std::vector<Slice> global_slices_of(const Tensor& local) const;

  // Elements [begin, end) of the flattened local tensor as boxes of the global tensor, in flat
  // order: how a distributed-optimizer shard, which cuts parameters anywhere, is stored and
  // loaded by global offsets. Each box is contiguous in the flat local tensor from flat_begin.
  struct FlatBox {
    int64_t flat_begin = 0;
    Shape global_offset;
    Shape shape;
  };
  std::vector<FlatBox> global_boxes(int64_t begin, int64_t end) const;

 private:
  // The local tensor as equal contiguous runs that each lie in one box of the global tensor: 1,
  // or with a blocked TP split one per block and coordinate of the dimensions before the split.
  int64_t contiguous_runs() const;
};

}  // namespace megatron
