#pragma once
// ParameterRegistry: every parameter of a model (one TP rank's shard of it), registered once.
//
// TP: a registry belongs to one TP rank of one TP group; its rank and size are given once, at
// construction, and every parameter registered is that rank's shard (parameter.h).
//
// Storage: all parameters of a model live in one flat buffer of the compute dtype (split in parts,
// some in FP8, under --fp8-param-gather: split_params), and all
// main gradients in one flat fp32 buffer (f64 when the parameters are f64, for gradient
// checks); each Parameter holds views into both. allocate() lays them out in registration
// order; DDP may move them into its bucket layout with set_layout(), and split the gradients into
// one buffer per bucket (split_grads) whose memory it gives back after each step and takes again
// when the next backward first writes the bucket (release_grads, acquire_grads): the gradients
// then cost memory only from the backward to the optimizer step, as PyTorch's set_to_none
// gradients do, not during the forward, where the activations peak. Element offsets
// (Parameter::buffer_offset) count over the whole buffer either way.
//
// Progress notifications, one listener each (DDP), so communication can overlap compute:
//   - forward: a model calls before_forward(p) for each parameter of a module before that
//     module's forward reads it, so the listener (DDP with --overlap-param-gather) waits for p's
//     all-gather just in time (what Megatron does with forward pre-hooks on every module);
//   - backward: a model calls grad_ready(p) once p's main gradient is final for the current
//     backward pass, so the listener (DDP with --overlap-grad-reduce) can start reducing it while
//     backward continues (Megatron's autograd post-accumulate hooks).
//   - a model also calls after_forward(p) once a module's forward no longer reads p, and
//     before_backward(p) before a module's backward (or its recomputed forward) reads p or
//     accumulates into p's main grad: Megatron FSDP (distributed/fully_sharded.h) gathers a
//     sharded parameter for each use and frees it after (Megatron's post-forward and pre-backward
//     hooks).
//
// Sharded weights (Megatron FSDP's optim_grads_params): between uses a parameter exists only as
// this rank's flat ranges of it (weight_shards()); Parameter::data is undefined then, and
// checkpoints save and load those ranges instead.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/parameters/parameter.h"

namespace megatron {

// Every parameter starts at a multiple of this many elements in the flat buffers, so it is
// 64-byte aligned in fp32 (vector loads on both backends).
inline constexpr int64_t kParamAlignment = 16;

class ParameterRegistry {
 public:
  // The registry of a model that is not split over TP.
  ParameterRegistry() : ParameterRegistry(0, 1) {}
  // The registry of TP rank `tp_rank` of a group of `tp_size` ranks, and of expert-parallel rank
  // `ep_rank` of `ep_size` (which expert-parallel parameters hold, ParamSpec::expert_parallel),
  // whose TP split is over expert TP rank `expert_tp_rank` of `expert_tp_size` (--expert-tensor-
  // parallel-size; size 0: the TP rank and size).
  ParameterRegistry(int tp_rank, int tp_size, int ep_rank = 0, int ep_size = 1, int expert_tp_rank = 0,
                    int expert_tp_size = 0);
  ParameterRegistry(const ParameterRegistry&) = delete;
  ParameterRegistry& operator=(const ParameterRegistry&) = delete;

  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  int ep_rank() const { return ep_rank_; }
  int ep_size() const { return ep_size_; }
  int expert_tp_rank() const { return expert_tp_rank_; }
  int expert_tp_size() const { return expert_tp_size_; }

  // Registers this TP rank's shard of a parameter; returns a stable pointer (valid for the
  // registry's lifetime). Views are created by allocate().
  Parameter* add(ParamSpec spec);
  // Makes the flat buffers on `device` and points every parameter into them.
  void allocate(DType params_dtype, Device device = Device::cpu());
  // Initialises every parameter from (seed, name, global element index): independent of TP
  // layout and of registration order. xavier_uniform (Megatron's --init-method-xavier-uniform):
  // the InitMethod::normal parameters are drawn from U(-a, a) instead, a = sqrt(6 / (fan_in +
  // fan_out)) of their global matrix (the last two dims; an expert's own matrix), as Megatron's
  // torch.nn.init.xavier_uniform_ draws them under --use-cpu-initialization.
  void initialize(uint64_t seed, bool xavier_uniform = false);
  // Zeroes every main gradient.
  void zero_grads();
  // The training step's zeroing (DDP::zero_grad): zeroes the main gradients except those of
  // spec.first_grad_overwrites parameters, which it marks instead for their next gradient to
  // overwrite them (Parameter::take_grad_overwrite). Those the backward never wrote must go
  // through zero_unwritten_grads() before anything reads them.
  void zero_grads_lazily();
  // Zeroes the main gradients of those of `params` (registration indices) still marked by
  // zero_grads_lazily(): parameters this step's backward did not reach.
  void zero_unwritten_grads(const std::vector<size_t>& params);
  // Moves parameter i (registration order) to element offsets[i] of new flat buffers of `numel`
  // elements, keeping its value and (GradsOnMove::keep) its main gradient; gaps hold zeros. Offsets
  // are multiples of the 16-element alignment and the parameters may not overlap.
  // GradsOnMove::drop releases the main gradients first and starts the new buffer at zero, so the
  // move holds two parameter buffers but never two gradient buffers (DDP's layout, made before any
  // backward: the peak of a large model's set-up).
  enum class GradsOnMove { keep, drop };
  void set_layout(const std::vector<int64_t>& offsets, int64_t numel, GradsOnMove grads = GradsOnMove::keep);

  // Splits the main gradients into consecutive parts ending at `ends` (increasing, the last the
  // buffer's size; no parameter may straddle two), all released until acquire_grads (zeroed then):
  // the flat buffer is dropped first, so the two are never held together (DDP splits before any
  // backward, which takes each part when it first reaches it).
  void split_grads(const std::vector<int64_t>& ends);
  size_t grad_parts() const { return grad_parts_.size(); }
  size_t grad_part_of(const Parameter& p) const;
  // Gives part `part`'s memory back; every view of it (main_grad, grad_slice) stays valid but may
  // not be read or written until acquire_grads(part).
  void release_grads(size_t part);
  // Gives a released part memory again, zeroed as zero_grads_lazily() zeroes (the linear layers'
  // weight gradients are marked to be overwritten instead); nothing when it holds memory.
  void acquire_grads(size_t part);
  bool grads_held(size_t part) const { return grad_parts_.at(part).memory_held(); }

  // --fp8-param-gather: splits the parameter buffer into consecutive parts ending at `ends`
  // (increasing, the last the buffer's size; no parameter may straddle two), part k in dtypes[k]:
  // a part in the compute dtype keeps its values, a part in an FP8 dtype starts as zero codes for
  // its holder (the distributed optimizer) to cast. The parameters of FP8 parts are exactly those
  // with Parameter::fp8 set.
  void split_params(const std::vector<int64_t>& ends, const std::vector<DType>& dtypes);
  // The element offset in the buffer where parameter part `part` begins.
  int64_t param_part_begin(size_t part) const { return param_part_begins_.at(part); }
  // Gives parameter part `part`'s memory back (DDP's release_weights_after_backward: the optimizer
  // step rewrites the values from the masters); every view stays valid but may not be read or
  // written until acquire_params(part), which gives it memory again, contents undefined.
  void release_params(size_t part);
  void acquire_params(size_t part);
  bool params_held(size_t part) const { return param_parts_.at(part).memory_held(); }

  // Drops the flat parameter buffer (with `params`) and the main-grad buffer (with `grads`) and
  // every parameter's views of them: Megatron FSDP keeps only shards, and points the views at
  // gathered buckets while a module uses them.
  void drop_buffers(bool params, bool grads);

  // At most one listener of each kind; an empty hook removes it.
  using ParamHook = std::function<void(const Parameter&)>;
  void set_before_forward_hook(ParamHook hook) { before_forward_hook_ = std::move(hook); }
  void set_after_forward_hook(ParamHook hook) { after_forward_hook_ = std::move(hook); }
  void set_before_backward_hook(ParamHook hook) { before_backward_hook_ = std::move(hook); }
  void set_grad_ready_hook(ParamHook hook) { grad_ready_hook_ = std::move(hook); }
  void before_forward(const Parameter& p) const {
    if (before_forward_hook_) before_forward_hook_(p);
  }
  void after_forward(const Parameter& p) const {
    if (after_forward_hook_) after_forward_hook_(p);
  }
  void before_backward(const Parameter& p) const {
    if (before_backward_hook_) before_backward_hook_(p);
  }
  void grad_ready(const Parameter& p) const {
    if (grad_ready_hook_) grad_ready_hook_(p);
  }

  // This rank's flat range [begin, end) of parameter `param` (registration index), `values` its
  // 1-D storage: what a rank holds of a sharded parameter between uses.
  struct WeightShard {
    size_t param = 0;
    int64_t begin = 0, end = 0;
    Tensor values;
  };
  // Sets (empty: clears) the shards the parameters are held as.
  void set_weight_shards(std::vector<WeightShard> shards) { weight_shards_ = std::move(shards); }
  const std::vector<WeightShard>& weight_shards() const { return weight_shards_; }
  bool weights_sharded() const { return !weight_shards_.empty(); }

  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }
  Parameter* find(const std::string& name) const;
  // Fixed by allocate(), whether or not the buffers have been dropped since.
  DType params_dtype() const { return params_dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  Device device() const { return device_; }
  // The flat parameter buffer (undefined once dropped); an error once split_params() split it.
  const Tensor& param_buffer() const;
  // Parameters of elements [begin, end) of the buffer, which must lie in one part.
  Tensor param_slice(int64_t begin, int64_t end) const;
  // Every part of the parameter buffer in order (the flat buffer alone until split; none once dropped).
  const std::vector<Tensor>& param_buffers() const { return param_parts_; }
  // The flat main-gradient buffer (undefined once dropped); an error once split_grads() split it.
  const Tensor& grad_buffer() const;
  // Main gradients of elements [begin, end) of the buffer, which must lie in one part.
  Tensor grad_slice(int64_t begin, int64_t end) const;
  // Every part of the main-gradient buffer in order (the flat buffer alone until split; none once dropped).
  const std::vector<Tensor>& grad_buffers() const { return grad_parts_; }
  int64_t num_local_elements() const {
    return param_parts_.empty() ? 0 : param_part_begins_.back() + param_parts_.back().numel();
  }

 private:
  int tp_rank_;
  int tp_size_;
  int ep_rank_;
  int ep_size_;
  int expert_tp_rank_;
  int expert_tp_size_;
  std::vector<std::unique_ptr<Parameter>> params_;
  // Zeroes part `part` as zero_grads_lazily() does.
  void zero_grads_lazily(size_t part);
  // Points every parameter's main_grad into its part.
  void point_main_grads();

  std::vector<Tensor> param_parts_;  // the parameters: the flat buffer, or its parts after split_params()
  std::vector<int64_t> param_part_begins_;
  std::vector<Tensor> grad_parts_;  // the main gradients: the flat buffer, or its parts after split_grads()
  std::vector<int64_t> grad_part_begins_;
  DType params_dtype_ = DType::f32, grad_dtype_ = DType::f32;
  Device device_ = Device::cpu();
  ParamHook before_forward_hook_;
  ParamHook after_forward_hook_;
  ParamHook before_backward_hook_;
  ParamHook grad_ready_hook_;
  std::vector<WeightShard> weight_shards_;
};

}  // namespace megatron
