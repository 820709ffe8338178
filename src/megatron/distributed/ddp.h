#pragma once
// DistributedDataParallel: gradient reduction over the data-parallel (DP x CP) group in buckets
// of the flat main-grad buffer (Megatron-Core's DistributedDataParallel and
// param_and_grad_buffer, reference/megatron-compat.md §9).
//
//   DistributedDataParallel ddp(model.parameters(), ctx, config);  // re-lays out the buffers
//   ddp.zero_grad();
//   for (m = 0; m < M; ++m) { ddp.set_last_micro_batch(m == M - 1); model.forward_backward(...); }
//   ddp.finish_grad_sync();     // main grads now hold the average over DP (or this rank's shard)
//   optimizer.step(...);        // the distributed optimizer then calls start_param_gather()
//   ddp.finish_param_gather();  // before evaluation or saving (the next forward waits by itself)
//
// Reduction: a bucket's fp32 gradients are scaled by 1/R (R = the DP x CP group's size), then
// summed over the group (Megatron's default, not an averaging collective): all-reduce without the
// distributed optimizer; reduce-scatter with it, after which shard r of each bucket on rank r holds the
// reduced gradient (the rest of the buffer is stale). Gradient accumulation: micro-batches before
// the last only accumulate; nothing is communicated until the last one.
//
// Gradient memory (without FSDP): each bucket's gradients are a buffer of their own
// (ParameterRegistry::split_grads), released from the start. zero_grad() gives every bucket's
// memory back; the backward
// takes a bucket's memory when it first reaches one of its parameters (the registry's
// before_backward()), zeroed except the linear layers' weight gradients, whose first gradient of
// the step overwrites them (no memset of ~90% of the buffer, no read of zeros); a bucket the
// backward never reached is taken, zeroed, before it reduces. So the gradients cost memory from the
// backward to the optimizer step only, as PyTorch's set_to_none gradients do: not during the
// forward, and during the backward only as far as it got, while it frees the activations it read
// (GPTModel::stage_backward). Megatron keeps them all along. Buckets have bucket_size elements with
// or without --overlap-grad-reduce (without it they still reduce together, after the backward).
//
// Weight memory (release_weights_after_backward, when the optimizer keeps f32 masters apart from
// 16-bit weights, on the device): the parameters are split into the same buckets, and a bucket's
// weights give their memory back once the last micro-batch's backward has reported all its
// parameters ready (the registry's grad_ready()); the optimizer step takes it again just before
// its update writes them from the masters, and gives the bucket's gradients back after
// (Optimizer::update_parts). So the end of the backward, where every gradient is held, no longer
// holds every weight too: 2 bytes an element less at the step's peak, about what fp32 parameters
// without a separate copy (PyTorch's AMP) hold. A parameter never reported ready keeps its bucket's
// weights. A read of a released weight is an error (Tensor::release_memory), not a stale value.
//
// Expert-parallel parameters (MoE experts split over EP) sit in buckets of their own, summed over
// the expert-data-parallel group instead, still scaled 1/R: each EP rank holds other experts, and
// an expert's gradient there already sums the tokens of the whole EP group (Megatron's
// expert_gradient_scaling_factor), so the sum over expert DP counts every DP rank's loss once.
//
// Overlap (--overlap-grad-reduce): the buffers are cut into buckets of about bucket_size elements
// in backward order, and the registry's grad_ready() notifications during the last micro-batch's
// backward start each bucket's collective (asynchronously) as soon as all its parameters are
// final. finish_grad_sync() starts any bucket still waiting and waits for every one. Without
// overlap finish_grad_sync() starts them all.
//
// With the distributed optimizer the word embedding tied across pipeline stages
// (ParamSpec::shared_embedding) sits in a bucket of its own, padded alike on both ends, so the
// first and last stages' DP shards of it cover the same elements and the embedding group can sum
// the reduced shards afterwards (Megatron's rule; finalize_model_grads.h).
//
// Parameter all-gather (distributed optimizer): after the update each bucket's parameter shards
// are all-gathered into the full parameter buffer. Without --overlap-param-gather the optimizer
// waits for them at once. With it (Megatron's forward pre-hooks), start_param_gather() starts the
// gather of the bucket the forward reads first, the last one (buckets are laid out in reverse
// registration order); the registry's before_forward() notifications then wait for exactly the
// bucket of the parameter about to be read, and each such wait starts the gather of the next
// bucket in forward order, so one gather runs while the modules of the previous bucket compute.
// finish_param_gather() starts and waits for whatever is left (before evaluation and saving).
//
// Megatron FSDP (shard_grads, shard_params: --data-parallel-sharding-strategy optim_grads and
// optim_grads_params): the distributed optimizer's layout with one bucket per module, the
// gradients (and parameters) held as this rank's shards between uses, each bucket reduce-scattered
// in every micro-batch's backward as soon as it is complete (fully_sharded.h). The accessors below
// (grad_shard, grad_of, param_of) are where the distributed optimizer finds its shards either way.
// The registry keeps no whole gradient (and, with shard_params, parameter) buffer once FSDP has
// taken its shards: the model trains only through this object from then on.
//
// Every rank must notify the same parameters in the same order (the model's forward and backward
// do), so the buckets' collectives are issued in the same order everywhere.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "megatron/distributed/buffer_layout.h"
#include "megatron/distributed/fully_sharded.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"

namespace megatron {

struct DdpConfig {
  bool overlap_grad_reduce = false;
  bool use_distributed_optimizer = false;
  bool overlap_param_gather = false;  // with the distributed optimizer: the optimizer does not wait
  int64_t bucket_size = 0;            // elements; 0: Megatron's max(4e7, 1e6 * DP)
  // Per parameter (registration order) the model chunk holding it (ModelChunks::param_chunks);
  // empty: one chunk. A bucket never spans two chunks (Megatron gives each chunk its own buffers),
  // so each chunk's buckets start reducing once its own backward of the last micro-batch is done,
  // while the pipeline's cool-down still runs the other chunks' backwards.
  std::vector<int64_t> param_chunks = {};
  // Megatron FSDP: gradients kept as shards (optim_grads), and parameters too (optim_grads_params);
  // both need use_distributed_optimizer, the parameters the gradients.
  bool shard_grads = false;
  bool shard_params = false;
  // The weights of each bucket released from its last backward of a step to the optimizer's update,
  // which rewrites them from its masters (see above); not with FSDP's or FP8 parameters.
  bool release_weights_after_backward = false;
};

class DistributedDataParallel {
 public:
  // Lays the registry's buffers out in buckets (values kept) and listens to its grad_ready().
  DistributedDataParallel(ParameterRegistry& registry, const ParallelContext& ctx, const DdpConfig& config);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const DdpConfig& config() const { return config_; }
  const BufferLayout& layout() const { return layout_; }
  // This rank's shard of every bucket (distributed optimizer only).
  const RankShards& shards() const;
  Communicator& group() const { return *group_; }
  // Whether some buckets hold expert-parallel parameters (sharded over expert DP).
  bool has_expert_buckets() const { return !layout_.buckets.empty() && layout_.buckets.back().expert_parallel; }
  // Whether some buckets hold FP8 parameters (--fp8-param-gather), which the distributed optimizer casts.
  bool has_fp8_buckets() const {
    return std::any_of(layout_.buckets.begin(), layout_.buckets.end(), [](const BucketLayout& b) { return b.fp8; });
  }
  const ParallelContext& context() const { return ctx_; }
  ParameterRegistry& registry() const { return *registry_; }

  // Zeros the main grads for a new step; no gradient reduction may be in flight.
  void zero_grad();
  // Whether the next backward is the step's last micro-batch (the one that communicates).
  void set_last_micro_batch(bool last) { last_micro_batch_ = last; }
  // Starts the reduction of every bucket not started yet and waits for all of them.
  void finish_grad_sync();
  // Buckets whose reduction has been started in this step (for tests and timers).
  int64_t buckets_started() const;

  // This rank's reduced gradients of bucket b's shard and of one owned range, and its parameters
  // (the compute copy) of one owned range: views of the whole buffers, or of FSDP's shards.
  // Distributed optimizer only.
  Tensor grad_shard(size_t bucket) const;
  Tensor grad_of(const ShardParamRange& r) const;
  Tensor param_of(const ShardParamRange& r) const;
  // The main grads of the parameters that saw only a sequence shard under SP (ParamSpec::
  // sequence_parallel), as this rank holds them after finish_grad_sync(): whole, or their owned ranges.
  std::vector<Tensor> sequence_parallel_grads() const;
  // Bytes held for weights and main gradients, now and at the peak (FSDP's change within a step).
  HeldBytes held_bytes() const;

  // Distributed optimizer: all-gathers each bucket's updated parameter shards into the full
  // parameter buffer, asynchronously (with overlap: the first bucket the forward reads; the
  // forward's notifications start the others). finish_param_gather() starts every gather not
  // started yet and waits for all (nothing when none is pending).
  void start_param_gather();
  void finish_param_gather();

  // What the parameter all-gather of the latest step did, in order: which bucket's gather was
  // started or waited for, and the parameter (registration index) whose forward use did it; none
  // when start_param_gather() or finish_param_gather() did. Tests read the order of the waits.
  struct ParamGatherEvent {
    enum class Kind { start, wait };
    Kind kind = Kind::start;
    size_t bucket = 0;
    std::optional<size_t> param;
    bool operator==(const ParamGatherEvent&) const = default;
  };
  const std::vector<ParamGatherEvent>& param_gather_events() const { return param_gather_events_; }

 private:
  void on_grad_ready(const Parameter& p);
  void start_bucket(size_t b);
  void on_before_forward(const Parameter& p);
  void start_param_gather_of(size_t b, std::optional<size_t> param);
  void install_hooks();
  void wait_param_gather_of(size_t b, std::optional<size_t> param);

  ParameterRegistry* registry_;
  ParallelContext ctx_;  // a copy: the groups are shared pointers
  std::shared_ptr<Communicator> group_;
  std::shared_ptr<Communicator> expert_group_;  // expert-data-parallel: expert buckets' reductions
  DdpConfig config_;
  BufferLayout layout_;
  RankShards shards_;
  bool last_micro_batch_ = true;
  std::vector<bool> param_ready_;         // per parameter, in this step's last backward
  std::vector<size_t> bucket_ready_;      // parameters ready per bucket
  std::vector<CommHandlePtr> grad_work_;  // per bucket; null until started
  std::vector<bool> bucket_started_;
  std::vector<bool> param_gather_pending_;  // per bucket: gathered this step but not waited for yet
  std::vector<CommHandlePtr> param_work_;   // per bucket, while a parameter all-gather is in flight
  std::vector<ParamGatherEvent> param_gather_events_;
  std::unique_ptr<FullyShardedBuffers> fsdp_;  // with shard_grads
};

// Megatron's default bucket size for a group of R ranks: max(4e7, 1e6 * R) elements.
int64_t default_ddp_bucket_size(int64_t group_size);

// The layout DDP gives a registry's buffers under `config` (the DP x CP group of group_size ranks,
// expert buckets sharded over expert_group_size): Megatron's buckets, or FSDP's one per module.
// megatron plan lays out the ranks it describes with it.
BufferLayout ddp_buffer_layout(const ParameterRegistry& registry, const DdpConfig& config, int64_t group_size,
                               int64_t expert_group_size);

}  // namespace megatron
