#include "megatron/distributed/fully_sharded.h"

#include <algorithm>
#include <map>

#include "megatron/ops/elementwise.h"

namespace megatron {

DataParallelSharding parse_data_parallel_sharding(const std::string& name) {
  if (name == "no_shard") return DataParallelSharding::no_shard;
  if (name == "optim") return DataParallelSharding::optim;
  if (name == "optim_grads") return DataParallelSharding::optim_grads;
  MEGATRON_CHECK(name == "optim_grads_params", "--data-parallel-sharding-strategy "
                                                   << name
                                                   << " is none of no_shard, optim, optim_grads, optim_grads_params");
  return DataParallelSharding::optim_grads_params;
}

std::vector<int64_t> fsdp_units(const ParameterRegistry& registry) {
  const std::string layers = "decoder.layers.";
  std::map<std::string, int64_t> ids;
  std::vector<int64_t> units;
  for (const auto& p : registry.params()) {
    const std::string& name = p->spec.name;
    std::string key = name.substr(0, name.find('.'));
    if (name.rfind(layers, 0) == 0) key = name.substr(0, name.find('.', layers.size()));
    units.push_back(ids.emplace(key, int64_t(ids.size())).first->second);
  }
  return units;
}

FullyShardedBuffers::FullyShardedBuffers(ParameterRegistry& registry, const BufferLayout& layout,
                                         const RankShards& shards, std::shared_ptr<Communicator> group,
                                         bool shard_params)
    : registry_(&registry), layout_(&layout), shards_(&shards), group_(std::move(group)), shard_params_(shard_params) {
  const Device device = registry.device();
  grad_shards_ = Tensor::zeros({shards.numel}, registry.grad_dtype(), device);
  add_grads(int64_t(grad_shards_.nbytes()));
  if (shard_params) {
    param_shards_ = Tensor::empty({shards.numel}, registry.params_dtype(), device);
    std::vector<ParameterRegistry::WeightShard> weight_shards;
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const Range mine = shards.in_buffer[b], at = shards.in_shards[b];
      Tensor dst = param_shards_.slice(at.begin, at.end);
      dst.copy_from(registry.param_buffer().slice(mine.begin, mine.end));
    }
    for (const ShardParamRange& r : shards.params)
      weight_shards.push_back({r.param, r.in_param.begin, r.in_param.end, param_of(r)});
    registry.set_weight_shards(std::move(weight_shards));
    add_weights(int64_t(param_shards_.nbytes()));
  } else {
    add_weights(int64_t(registry.param_buffer().nbytes()));
  }
  registry.drop_buffers(shard_params, /*grads=*/true);
  buckets_.resize(layout.buckets.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].used.assign(layout.buckets[b].params.size(), false);
    buckets_[b].ready.assign(layout.buckets[b].params.size(), false);
  }
}

FullyShardedBuffers::~FullyShardedBuffers() { registry_->set_weight_shards({}); }

Tensor FullyShardedBuffers::grad_shard(size_t bucket) const {
  const Range r = shards_->in_shards[bucket];
  return grad_shards_.slice(r.begin, r.end);
}

Tensor FullyShardedBuffers::param_of(const ShardParamRange& r) const {
  MEGATRON_CHECK(shard_params_, "parameter shards exist only with optim_grads_params");
  return param_shards_.slice(r.in_shards.begin, r.in_shards.end);
}

size_t FullyShardedBuffers::slot_of(const Parameter& p) const {
  const std::vector<size_t>& params = layout_->buckets[bucket_of(p)].params;
  return size_t(std::find(params.begin(), params.end(), p.index) - params.begin());
}

void FullyShardedBuffers::add_weights(int64_t bytes) {
  held_.weights += bytes;
  held_.weights_peak = std::max(held_.weights_peak, held_.weights);
}

void FullyShardedBuffers::add_grads(int64_t bytes) {
  held_.grads += bytes;
  held_.grads_peak = std::max(held_.grads_peak, held_.grads);
}

void FullyShardedBuffers::zero_grad() {
  MEGATRON_CHECK(reductions_.empty(), "zero_grad() while " << reductions_.size()
                                                           << " gradient reductions are in flight; call "
                                                           << "finish_grad_sync() first");
  grad_shards_.zero();
}

void FullyShardedBuffers::release_gathered_params() {
  for (size_t b = 0; b < buckets_.size(); ++b) release_params(b);
}

// ---- parameters: gathered for each use, freed after ----

void FullyShardedBuffers::start_gather(size_t b) {
  Bucket& bucket = buckets_[b];
  if (bucket.params.defined()) return;
  const Range range = layout_->buckets[b].range, mine = shards_->in_shards[b];
  bucket.params = Tensor::empty({range.size()}, registry_->params_dtype(), registry_->device());
  add_weights(int64_t(bucket.params.nbytes()));
  bucket.gather = group_->all_gather_async(bucket.params, param_shards_.slice(mine.begin, mine.end));
}

void FullyShardedBuffers::wait_gather(size_t b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.gather) return;
  bucket.gather->wait();
  bucket.gather.reset();
  const int64_t begin = layout_->buckets[b].range.begin;
  for (size_t i : layout_->buckets[b].params) {
    Parameter& p = *registry_->params()[i];
    const int64_t offset = p.buffer_offset - begin;
    p.data = bucket.params.slice(offset, offset + shape_numel(p.local_shape)).view(p.local_shape);
  }
}

void FullyShardedBuffers::release_params(size_t b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.params.defined()) return;
  wait_gather(b);  // a prefetch never waited for
  for (size_t i : layout_->buckets[b].params) registry_->params()[i]->data = Tensor();
  add_weights(-int64_t(bucket.params.nbytes()));
  bucket.params = Tensor();
  bucket.in_use = 0;
  std::fill(bucket.used.begin(), bucket.used.end(), false);
}

// Buckets lie in reverse registration order: the forward reads bucket B-1 first, the backward 0.
// The embedding's bucket (B-1) prefetches nothing: a tied output layer reads it again at the end
// of the forward, where prefetching the first layer would hold that layer through the whole
// backward; the first layer's gather waits instead (one of the forward's gathers).
void FullyShardedBuffers::before_forward(const Parameter& p) {
  const size_t b = bucket_of(p);
  start_gather(b);
  wait_gather(b);
  if (b > 0 && b + 1 < buckets_.size()) start_gather(b - 1);
  ++buckets_[b].in_use;
  buckets_[b].used[slot_of(p)] = true;
}

void FullyShardedBuffers::after_forward(const Parameter& p) {
  Bucket& bucket = buckets_[bucket_of(p)];
  MEGATRON_CHECK(bucket.in_use > 0, p.spec.name << " reported after its forward without before it");
  if (--bucket.in_use == 0 && std::all_of(bucket.used.begin(), bucket.used.end(), [](bool u) { return u; }))
    release_params(bucket_of(p));
}

void FullyShardedBuffers::before_backward(const Parameter& p) {
  const size_t b = bucket_of(p);
  if (shard_params_) {
    start_gather(b);
    wait_gather(b);
    if (b + 1 < buckets_.size()) start_gather(b + 1);
  }
  open_grads(b);
}

// ---- gradients: a bucket's full gradient lives while its module's backward runs ----

void FullyShardedBuffers::open_grads(size_t b) {
  Bucket& bucket = buckets_[b];
  if (bucket.reduction) finish_reduction(b);  // the previous micro-batch's
  if (bucket.grads.defined()) return;
  const Range range = layout_->buckets[b].range;
  bucket.grads = Tensor::zeros({range.size()}, registry_->grad_dtype(), registry_->device());
  add_grads(int64_t(bucket.grads.nbytes()));
  for (size_t i : layout_->buckets[b].params) {
    Parameter& p = *registry_->params()[i];
    const int64_t offset = p.buffer_offset - range.begin;
    p.main_grad = bucket.grads.slice(offset, offset + shape_numel(p.local_shape)).view(p.local_shape);
  }
}

void FullyShardedBuffers::grad_ready(const Parameter& p) {
  const size_t b = bucket_of(p);
  Bucket& bucket = buckets_[b];
  MEGATRON_CHECK(bucket.grads.defined() && !bucket.reduction,
                 p.spec.name << " reported its gradient ready without a before_backward "
                             << "notification: its module's backward had nowhere to put it");
  const size_t slot = slot_of(p);
  MEGATRON_CHECK(!bucket.ready[slot], p.spec.name << " was reported ready twice in one backward pass");
  bucket.ready[slot] = true;
  if (++bucket.ready_count < int64_t(bucket.ready.size())) return;
  start_reduction(b);
  if (shard_params_) release_params(b);
}

void FullyShardedBuffers::start_reduction(size_t b) {
  Bucket& bucket = buckets_[b];
  for (size_t i : layout_->buckets[b].params) registry_->params()[i]->main_grad = Tensor();
  const int64_t R = group_->size();
  if (R > 1) ops::scale(bucket.grads, bucket.grads, float(1.0 / double(R)));  // Megatron's pre-scaling
  bucket.reduced = Tensor::empty({shards_->in_shards[b].size()}, registry_->grad_dtype(), registry_->device());
  add_grads(int64_t(bucket.reduced.nbytes()));
  bucket.reduction = group_->reduce_scatter_async(bucket.reduced, bucket.grads, ReduceOp::sum);
  reductions_.push_back(b);
  std::fill(bucket.ready.begin(), bucket.ready.end(), false);
  bucket.ready_count = 0;
  // At most two full gradients in flight; MPI progresses the others only inside MPI calls.
  while (reductions_.size() > 2) finish_reduction(reductions_.front());
  for (size_t r : reductions_) buckets_[r].reduction->test();
}

void FullyShardedBuffers::finish_reduction(size_t b) {
  Bucket& bucket = buckets_[b];
  bucket.reduction->wait();
  bucket.reduction.reset();
  Tensor shard = grad_shard(b);
  ops::add(shard, shard, bucket.reduced);  // micro-batches accumulate into the shard
  add_grads(-int64_t(bucket.reduced.nbytes() + bucket.grads.nbytes()));
  bucket.reduced = Tensor();
  bucket.grads = Tensor();
  reductions_.erase(std::find(reductions_.begin(), reductions_.end(), b));
}

void FullyShardedBuffers::finish_grad_sync() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    MEGATRON_CHECK(!buckets_[b].grads.defined() || buckets_[b].reduction,
                   "the gradients of bucket " << b << " were opened by a backward that did not report all "
                                              << "of them ready; every parameter's gradient must be reported");
  while (!reductions_.empty()) finish_reduction(reductions_.front());
}

}  // namespace megatron
