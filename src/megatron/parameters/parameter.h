#pragma once
// Parameters and their metadata: the one source of truth (DESIGN principle 5). Each parameter
// is registered once with its Megatron name, global shape and TP split; DDP buffers, the
// optimizer, checkpoint sharding and initialisation all read this.
//
// Storage: all parameters of a model live in one flat buffer of the compute dtype, and all
// main gradients in one flat fp32 buffer (f64 when the parameters are f64, for gradient
// checks); each Parameter holds views into both. allocate() lays them out in registration
// order; DDP may move them into its bucket layout with set_layout().
//
// Backward progress: a model calls grad_ready(p) once p's main gradient is final for the
// current backward pass, so a listener (DDP with --overlap-grad-reduce) can start reducing it
// while backward continues (what Megatron does with autograd post-accumulate hooks).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"

namespace megatron {

// Every parameter starts at a multiple of this many elements in the flat buffers, so it is
// 64-byte aligned in fp32 (vector loads on both backends).
inline constexpr int64_t kParamAlignment = 16;

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
  bool sequence_parallel = false;  // replicated under TP but sees only a sequence shard under SP
};

struct Parameter {
  ParamSpec spec;
  size_t index = 0;  // registration order
  Shape local_shape;
  int tp_rank = 0;
  int tp_size = 1;
  Tensor data;                // compute copy (params dtype), view into the parameter buffer
  Tensor main_grad;           // accumulation buffer (f32, or f64), view into the gradient buffer
  int64_t buffer_offset = 0;  // element offset of this parameter in the flat buffers

  // The part of a flat buffer (same layout as the parameter buffer) that belongs to this parameter.
  Tensor view_of(const Tensor& flat_buffer) const {
    return flat_buffer.slice(buffer_offset, buffer_offset + shape_numel(local_shape)).view(local_shape);
  }

  // A replicated parameter on a TP rank other than 0: a copy of TP rank 0's. Such copies are not
  // counted again in the gradient norm and not saved again (Megatron's
  // param_is_not_tensor_parallel_duplicate, negated).
  bool is_tensor_parallel_duplicate() const { return spec.partition_dim < 0 && tp_rank != 0; }

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
};

class ParameterRegistry {
 public:
  // Registers a parameter for this TP rank; returns a stable pointer (valid for the registry's
  // lifetime). Views are created by allocate().
  Parameter* add(ParamSpec spec, int tp_rank, int tp_size);
  // Makes the flat buffers on `device` and points every parameter into them.
  void allocate(DType params_dtype, Device device = Device::cpu());
  // Initialises every parameter from (seed, name, global element index): independent of TP
  // layout and of registration order.
  void initialize(uint64_t seed);
  void zero_grads();
  // Moves parameter i (registration order) to element offsets[i] of new flat buffers of `numel`
  // elements, keeping its value and main gradient; gaps hold zeros. Offsets are multiples of the
  // 16-element alignment and the parameters may not overlap.
  void set_layout(const std::vector<int64_t>& offsets, int64_t numel);

  using GradReadyHook = std::function<void(const Parameter&)>;
  // At most one listener; an empty hook removes it.
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }
  void grad_ready(const Parameter& p) const {
    if (grad_ready_hook_) grad_ready_hook_(p);
  }

  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }
  Parameter* find(const std::string& name) const;
  DType params_dtype() const { return param_buffer_.dtype(); }
  DType grad_dtype() const { return grad_buffer_.dtype(); }
  Tensor& param_buffer() { return param_buffer_; }
  Tensor& grad_buffer() { return grad_buffer_; }
  int64_t num_local_elements() const { return param_buffer_.numel(); }

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Tensor param_buffer_;
  Tensor grad_buffer_;
  GradReadyHook grad_ready_hook_;
};

}  // namespace megatron
