#pragma once
// The state AdamW keeps over an optimizer's index space (a registry's whole flat buffer, or the
// distributed optimizer's concatenated shards): fp32 master weights, when kept apart from the model's
// parameters, and the two moments; and the update of every piece of that space.
//
// Optimizer CPU offload (Megatron's --optimizer-cpu-offload, --optimizer-offload-fraction): the
// pieces covering the first `offload_fraction` of the elements, cut at a piece's end (Megatron's
// HybridDeviceOptimizer splits by whole parameters), keep their state in host memory (pinned on a
// GPU) and are updated on the CPU cores by the CPU backend's AdamW op (OpenMP). The master weights
// of offloaded pieces are always kept apart: the model's copy lives on the device.
//
// With --use-precision-aware-optimizer the device's f32 masters of bf16 parameters are kept as
// 16-bit remainders (core/param_remainder.h): 2 bytes an element instead of 4, the same updates bit
// for bit, the bf16 parameters rounded to nearest with ties away from zero.
//
// step() overlaps the copies with the updates. Per chunk of pieces the offloaded update is a
// pipeline on two staging slots whose copies run on a copy stream (offload_copies.h): while the
// CPU updates chunk k, the stream copies the parameters of chunk k-1 up and the gradients of chunk
// k+1 down; the device's own pieces are updated by kernels on the compute stream meanwhile, and the
// compute stream's next work (the next forward, the distributed optimizer's parameter all-gather)
// waits on the last upload without blocking the host. The caller has taken the grad norm and the
// non-finite count over all gradients before (Optimizer::step). On the CPU backend the "host"
// buffers are separate CPU buffers and the same code runs, copies deferred until a wait: the op and
// its inputs are the same, so the update is the same bits as without offload.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/core/tensor.h"
#include "megatron/ops/adamw.h"
#include "megatron/ops/fp8.h"
#include "megatron/optimizer/offload_copies.h"

namespace megatron {

struct AdamWStateOptions {
  bool cpu_offload = false;       // --optimizer-cpu-offload
  double offload_fraction = 1.0;  // --optimizer-offload-fraction: share of the elements offloaded
  // Elements per pipeline chunk (no flag): 64 Mi (256 MiB of fp32 gradients per staging slot), large
  // enough that each copy runs at full link speed, small enough that the first copy and the last,
  // which nothing overlaps, are short. Tests make it small to run many chunks on a small model.
  int64_t chunk_elements = int64_t(64) << 20;
  // --use-precision-aware-optimizer (store_param_remainders): the f32 masters of bf16 parameters on
  // the device kept as 16-bit remainders beside them (core/param_remainder.h); offloaded masters
  // stay f32 in host memory.
  bool store_param_remainders = false;
};

// One step's rates from the schedule (OptimizerParamScheduler): the learning rate, the weight decay
// of the pieces that decay, and under --decoupled-lr the learning rate of the pieces marked
// decoupled_lr (the embedding and output layer; unset: `lr`).
struct StepRates {
  StepRates(float lr_, float weight_decay_, std::optional<float> decoupled_lr_ = std::nullopt)
      : lr(lr_), weight_decay(weight_decay_), decoupled_lr(decoupled_lr_) {}
  float lr;
  float weight_decay;
  std::optional<float> decoupled_lr;
};

class AdamWState {
 public:
  // Elements [begin, end) of the index space, updated from `grad` into `param` (views of the same
  // length on the model's device; the master weights when they are not kept apart).
  struct Piece {
    int64_t begin = 0, end = 0;
    Tensor grad, param;
    bool weight_decay = true;
    bool decoupled_lr = false;                  // updated at StepRates::decoupled_lr (ParamSpec::embedding_or_output)
    ops::Fp8TensorScaling* fp8_cast = nullptr;  // set_params' fp8_casts
  };
  // `pieces` in increasing order, not overlapping, inside [0, numel), possibly none (a
  // distributed-optimizer shard of padding only); the model's parameters live on `device` in
  // `params_dtype`. `state_dtype`: f32 (f64 for f64 models). The master weights are kept apart when
  // the parameters are in another dtype, or offloaded; they start as the pieces' parameters.
  AdamWState(std::vector<Piece> pieces, int64_t numel, Device device, DType params_dtype, DType state_dtype,
             const AdamWStateOptions& options);

  // AdamW on every piece: `base`'s constants (its lr and weight decay unused), each piece's learning
  // rate and weight decay from `rates`.
  void step(const ops::AdamWParams& base, const StepRates& rates);
  // AdamW on the pieces inside the index range [begin, end), which may cut no piece and hold none
  // offloaded: an update part by part (Optimizer::update_parts).
  void step(const ops::AdamWParams& base, const StepRates& rates, int64_t begin, int64_t end);
  // The parameters of the pieces inside [begin, end) written from their masters, which must be kept
  // apart on the device in f32 (not as remainders, not for FP8 codes): after an update, what that
  // update wrote, bit for bit (ops::cast rounds as AdamW's copy does).
  void write_params_from_masters(int64_t begin, int64_t end);
  // Points the pieces at other parameter tensors (one each, in order, of the same lengths; the
  // masters stay): the distributed optimizer's once it holds some in FP8 (distributed/fp8_params.h).
  // A piece of FP8 codes keeps f32 masters on the device, which reload_master() leaves (their
  // holder rebuilds them); step() casts its codes in the update where fp8_casts names the piece's
  // scaling state (the delayed recipe, whose scale is known before the update: its scale, its
  // amax recorded in amax_history[0]; ops::adamw_step_fp8), and otherwise leaves them to their
  // holder. fp8_casts: empty, or one entry per piece (null: none).
  void set_params(const std::vector<Tensor>& params, const std::vector<ops::Fp8TensorScaling*>& fp8_casts = {});

  // Views of the state for elements [begin, end) of one piece (for checkpoints): on the host or the
  // device, as the piece's state lives.
  Tensor exp_avg(int64_t begin, int64_t end) const;
  Tensor exp_avg_sq(int64_t begin, int64_t end) const;
  // The master weights of [begin, end) in state_dtype, where they are kept apart: a view of the
  // state, or, kept as remainders, a host tensor joined from them and the parameters.
  Tensor master_values(int64_t begin, int64_t end) const;
  // Loads the master weights of [begin, end): `read` fills the state_dtype tensor it is handed (a
  // view of the state; kept as remainders, a host tensor then split into the parameters, which the
  // masters overrule, and the remainders).
  void load_master(int64_t begin, int64_t end, const std::function<void(Tensor&)>& read);
  // Whether the master weights differ from the model's parameters (another dtype), so checkpoints
  // keep them; otherwise they equal the parameters after every step (offloaded f32 copies too) and
  // are rebuilt from them on load.
  bool master_in_checkpoint() const { return device_master_; }
  // The master weights from the model's parameters again (after a checkpoint loaded them).
  void reload_master();
  // Bytes of state on the model's device and in host memory (the offloaded part).
  size_t device_bytes() const;
  size_t host_bytes() const;

 private:
  struct Part {  // the state of the index range [first, first + numel) on one side
    int64_t first = 0;
    Tensor master, exp_avg, exp_avg_sq;
    std::vector<std::shared_ptr<void>> pinned;  // the host blocks the tensors view, on GPUs
  };
  const Part& part_of(int64_t begin) const { return begin < host_end_ ? host_ : device_; }
  Tensor view(const Tensor& t, const Part& part, int64_t begin, int64_t end) const;
  // Whether [begin, end) keeps its masters as remainders (device_.master is u16).
  bool remainders_at(int64_t begin) const { return begin >= host_end_ && device_.master.dtype() == DType::u16; }
  // The model's parameters for [begin, end), inside one piece.
  Tensor param_range(int64_t begin, int64_t end) const;
  // The pieces inside [begin, end) as an index range of pieces_ (none cut), all on the device.
  std::pair<size_t, size_t> device_pieces_in(int64_t begin, int64_t end) const;
  void step_on_device(const ops::AdamWParams& base, const StepRates& rates, std::pair<size_t, size_t> pieces);
  void step_offloaded(const ops::AdamWParams& base, const StepRates& rates);

  std::vector<Piece> pieces_;
  size_t host_pieces_ = 0;  // pieces_[0, host_pieces_) are offloaded
  int64_t host_end_ = 0;    // their index range is [0, host_end_)
  bool device_master_ = false;
  Part host_, device_;
  // The offloaded elements in chunks of at most AdamWStateOptions::chunk_elements, each a run of segments (a piece,
  // or a part of a large one) packed into a staging slot: gradients (state dtype) and parameters
  // (the model's dtype), two slots of each for the pipeline.
  struct Segment {
    size_t piece = 0;
    int64_t begin = 0, end = 0;  // in the index space
    int64_t slot_offset = 0;
  };
  std::vector<std::vector<Segment>> chunks_;
  Tensor grad_slots_[2], param_slots_[2];
  std::vector<std::shared_ptr<void>> slot_memory_;
  std::unique_ptr<OffloadCopies> copies_;  // where chunks_ is not empty
};

}  // namespace megatron
