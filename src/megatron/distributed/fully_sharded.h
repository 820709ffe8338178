#pragma once
// Megatron FSDP's sharded gradients and parameters (--use-megatron-fsdp with
// --data-parallel-sharding-strategy optim_grads or optim_grads_params; ZeRO-2 and ZeRO-3), in the
// distributed optimizer's flat buffers: the same bucket layout (buffer_layout.h) and the same
// shards (RankShards: rank r owns shard r of every bucket, cutting parameters anywhere). The
// optimizer state is sharded as the distributed optimizer shards it; this class holds the rest.
//
// Buckets are FSDP units: one module's parameters each (the embedding, each decoder layer, the
// final norm, the output layer: fsdp_units), so a module's use gathers exactly its bucket.
//
// Gradients (both strategies): between steps a rank holds only its shards of the fp32 main grads
// (grad_shards, RankShards::numel elements). A bucket's full gradient exists while its module's
// backward runs: the model's before_backward() notification allocates it (zeroed) and points the
// parameters' main_grad views into it; once every parameter of the bucket reported grad_ready()
// it is scaled by 1/R and reduce-scattered over DP x CP, this rank's part added to its shard, and
// freed. This happens in every micro-batch's backward (gradients reduce-scattered as produced, as
// Megatron FSDP does), so no full gradient outlives its module's backward; at most two buckets'
// reductions are in flight. finish_grad_sync() completes the last ones.
//
// Parameters (optim_grads_params): between uses a rank holds only its shards (param_shards, the
// compute dtype), which the optimizer updates in place (the master weights when the model is
// fp32/f64, or the compute copy it writes from separate masters). A module's forward or backward
// gathers its bucket just before it runs (before_forward / before_backward: all-gather of the
// shards over DP x CP into a bucket-sized tensor that the parameters' data views point into) and
// starts the gather of the next bucket in that direction (prefetch; not from the embedding's
// bucket, which a tied output layer reads again last); the forward frees a bucket
// once every parameter reported in it has reported after_forward (so the tied word embedding,
// read again by the output layer, is gathered again there), the backward once its gradients are
// reduced. Parameter::data is undefined between uses, and checkpoints save and load the shards
// (ParameterRegistry::weight_shards). With optim_grads the parameter buffer stays whole and the
// distributed optimizer's all-gather refreshes it after each step, as under --use-distributed-optimizer.
//
// Memory: held_bytes() counts what is allocated now and at its peak: weights (shards plus gathered
// buckets, or the whole buffer) and gradients (shards plus full buckets in flight).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megatron/distributed/buffer_layout.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"

namespace megatron {

// Megatron's --data-parallel-sharding-strategy (with --use-megatron-fsdp): what is sharded over
// the data-parallel ranks besides nothing (no_shard, plain DDP): the optimizer state (optim, the
// distributed optimizer), also the gradients (optim_grads), also the parameters (optim_grads_params).
enum class DataParallelSharding { no_shard, optim, optim_grads, optim_grads_params };
DataParallelSharding parse_data_parallel_sharding(const std::string& name);

// The FSDP unit of each parameter (registration order), from its Megatron name: decoder layer i
// ("decoder.layers.<i>."), else its top-level module ("embedding", "decoder" for the final norm,
// "output_layer"); equal numbers for one unit.
std::vector<int64_t> fsdp_units(const ParameterRegistry& registry);

// Bytes a rank holds for weights and main gradients: now and at their peak since the last reset.
struct HeldBytes {
  int64_t weights = 0, weights_peak = 0;
  int64_t grads = 0, grads_peak = 0;
};

class FullyShardedBuffers {
 public:
  // Takes this rank's shards from the registry's whole buffers (laid out as `layout`) and drops
  // those buffers (the gradients always, the parameters with shard_params).
  FullyShardedBuffers(ParameterRegistry& registry, const BufferLayout& layout, const RankShards& shards,
                      std::shared_ptr<Communicator> group, bool shard_params);
  ~FullyShardedBuffers();
  FullyShardedBuffers(const FullyShardedBuffers&) = delete;
  FullyShardedBuffers& operator=(const FullyShardedBuffers&) = delete;

  bool shards_params() const { return shard_params_; }
  // This rank's reduced gradient of one owned range, and its shard of a whole bucket.
  Tensor grad_of(const ShardParamRange& r) const { return grad_shards_.slice(r.in_shards.begin, r.in_shards.end); }
  Tensor grad_shard(size_t bucket) const;
  // This rank's shard of the parameters of one owned range (shard_params only).
  Tensor param_of(const ShardParamRange& r) const;

  void zero_grad();
  // Completes every gradient reduction in flight (the step's last micro-batch is done).
  void finish_grad_sync();
  // Frees every gathered bucket: after the shards changed (the optimizer step, a checkpoint load)
  // a gathered copy is stale. A forward's prefetch may leave one it did not read (the tied
  // output layer, the forward's last reader of the embedding, prefetches the first layer).
  void release_gathered_params();

  void before_forward(const Parameter& p);
  void after_forward(const Parameter& p);
  void before_backward(const Parameter& p);
  void grad_ready(const Parameter& p);

  HeldBytes held_bytes() const { return held_; }
  void reset_peak() {
    held_.weights_peak = held_.weights;
    held_.grads_peak = held_.grads;
  }

 private:
  struct Bucket {
    Tensor params;            // gathered, while in use (shard_params)
    CommHandlePtr gather;     // the all-gather in flight into `params`
    int64_t in_use = 0;       // before_forward minus after_forward notifications
    std::vector<bool> used;   // per parameter of the bucket: reported in this forward
    Tensor grads;             // the full gradient while its module's backward runs
    std::vector<bool> ready;  // per parameter of the bucket: grad_ready in this backward
    int64_t ready_count = 0;
    Tensor reduced;           // this rank's part of `grads`, reduce-scattered into
    CommHandlePtr reduction;  // in flight into `reduced`
  };
  size_t bucket_of(const Parameter& p) const { return layout_->param_bucket[p.index]; }
  size_t slot_of(const Parameter& p) const;  // p's position in its bucket's parameter list
  void start_gather(size_t b);
  void wait_gather(size_t b);
  void release_params(size_t b);
  void open_grads(size_t b);
  void start_reduction(size_t b);
  void finish_reduction(size_t b);
  void add_weights(int64_t bytes);
  void add_grads(int64_t bytes);

  ParameterRegistry* registry_;
  const BufferLayout* layout_;
  const RankShards* shards_;
  std::shared_ptr<Communicator> group_;
  bool shard_params_;
  Tensor grad_shards_, param_shards_;  // this rank's shards of every bucket, concatenated
  std::vector<Bucket> buckets_;
  std::vector<size_t> reductions_;  // buckets whose reduction is in flight, oldest first
  HeldBytes held_;
};

}  // namespace megatron
