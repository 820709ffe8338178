#include "megatron/distributed/ddp.h"

#include <algorithm>

#include "megatron/ops/elementwise.h"

namespace megatron {

int64_t default_ddp_bucket_size(int64_t group_size) { return std::max<int64_t>(40000000, 1000000 * group_size); }

BufferLayout ddp_buffer_layout(const ParameterRegistry& registry, const DdpConfig& config, int64_t group_size,
                               int64_t expert_group_size) {
  std::vector<int64_t> numels, bucket_group;
  std::vector<bool> expert_parallel, fp8;
  for (const auto& p : registry.params()) {
    numels.push_back(shape_numel(p->local_shape));
    expert_parallel.push_back(p->spec.expert_parallel);
    fp8.push_back(p->fp8.has_value());
    // Chunks count from 0; the shared embedding's group, -1, is its alone.
    const bool alone = p->spec.shared_embedding && config.use_distributed_optimizer;
    bucket_group.push_back(alone ? -1 : config.param_chunks.empty() ? 0 : config.param_chunks[p->index]);
  }
  // FSDP: one bucket per module, whatever the bucket size. Otherwise buckets of bucket_size with or
  // without overlap: each bucket's gradients take memory only from the backward that first writes
  // them to the step (ddp.h), so one bucket for everything would hold them all through the backward.
  const int64_t bucket_size = config.shard_grads       ? 0
                              : config.bucket_size > 0 ? config.bucket_size
                                                       : default_ddp_bucket_size(group_size);
  return make_buffer_layout(numels, {.shard_group_size = group_size,
                                     .bucket_size = bucket_size,
                                     .distributed_optimizer = config.use_distributed_optimizer,
                                     .expert_parallel = expert_parallel,
                                     .expert_shard_group_size = expert_group_size,
                                     .bucket_group = config.shard_grads ? fsdp_units(registry) : bucket_group,
                                     .fp8 = fp8});
}

DistributedDataParallel::DistributedDataParallel(ParameterRegistry& registry, const ParallelContext& ctx,
                                                 const DdpConfig& config)
    : registry_(&registry), ctx_(ctx), group_(ctx.dp_cp), config_(config) {
  MEGATRON_CHECK(group_ != nullptr, "DDP needs the context's dp_cp group; build the context with initialize_parallel");
  MEGATRON_CHECK(!config.overlap_param_gather || config.use_distributed_optimizer,
                 "--overlap-param-gather needs --use-distributed-optimizer: only sharded parameters are gathered");
  MEGATRON_CHECK(!registry.params().empty(), "DDP over a parameter registry without parameters; build the model first");
  MEGATRON_CHECK(config.param_chunks.empty() || config.param_chunks.size() == registry.params().size(),
                 "DDP: model chunks given for " << config.param_chunks.size() << " parameters, but the registry has "
                                                << registry.params().size());
  MEGATRON_CHECK(!config.shard_grads || config.use_distributed_optimizer,
                 "sharded gradients (Megatron FSDP's optim_grads) need the distributed optimizer's layout");
  MEGATRON_CHECK(!config.shard_params || config.shard_grads,
                 "sharded parameters (optim_grads_params) need sharded gradients (optim_grads) too");
  const bool has_experts = std::any_of(registry.params().begin(), registry.params().end(),
                                       [](const auto& p) { return p->spec.expert_parallel; });
  MEGATRON_CHECK(!has_experts || ctx.expert_dp != nullptr,
                 "DDP over expert-parallel parameters needs the context's expert_dp group; build the context "
                     << "with initialize_parallel");
  MEGATRON_CHECK(!has_experts || !config.shard_grads,
                 "Megatron FSDP with expert-parallel parameters (MoE) is not built; use --use-distributed-optimizer");
  const bool has_fp8_params =
      std::any_of(registry.params().begin(), registry.params().end(), [](const auto& p) { return p->fp8.has_value(); });
  MEGATRON_CHECK(!has_fp8_params || (config.use_distributed_optimizer && !config.shard_grads),
                 "FP8 parameters (--fp8-param-gather) need --use-distributed-optimizer, which casts them, without "
                 "Megatron FSDP (not built with FP8 parameters here)");
  expert_group_ = has_experts ? ctx.expert_dp : group_;
  layout_ = ddp_buffer_layout(registry, config, group_->size(), expert_group_->size());
  // Gradients start at zero (zero_grad begins every step), so the move need not hold two gradient buffers.
  registry.set_layout(layout_.param_offsets(), layout_.numel, ParameterRegistry::GradsOnMove::drop);
  if (config.use_distributed_optimizer) shards_ = rank_shards(layout_, group_->rank(), expert_group_->rank());
  MEGATRON_CHECK(!config.release_weights_after_backward || (!config.shard_grads && !has_fp8_params),
                 "released weights between the backward and the step need whole parameter buckets in the compute "
                 "dtype: not built with Megatron FSDP or FP8 parameters (--fp8-param-gather)");
  if (config.shard_grads) {
    fsdp_ = std::make_unique<FullyShardedBuffers>(registry, layout_, shards_, group_, config.shard_params);
  } else {
    std::vector<int64_t> bucket_ends;
    for (const BucketLayout& bucket : layout_.buckets) bucket_ends.push_back(bucket.range.end);
    registry.split_grads(bucket_ends);
    if (config.release_weights_after_backward)
      registry.split_params(bucket_ends, std::vector<DType>(bucket_ends.size(), registry.params_dtype()));
  }

  const size_t buckets = layout_.buckets.size();
  param_ready_.assign(registry.params().size(), false);
  bucket_ready_.assign(buckets, 0);
  bucket_started_.assign(buckets, false);
  grad_work_.resize(buckets);
  param_gather_pending_.assign(buckets, false);
  param_work_.resize(buckets);
  install_hooks();
}

void DistributedDataParallel::install_hooks() {
  ParameterRegistry& registry = *registry_;
  if (fsdp_) {
    FullyShardedBuffers* fsdp = fsdp_.get();
    registry.set_grad_ready_hook([fsdp](const Parameter& p) { fsdp->grad_ready(p); });
    registry.set_before_backward_hook([fsdp](const Parameter& p) { fsdp->before_backward(p); });
    if (config_.shard_params) {
      registry.set_before_forward_hook([fsdp](const Parameter& p) { fsdp->before_forward(p); });
      registry.set_after_forward_hook([fsdp](const Parameter& p) { fsdp->after_forward(p); });
      return;
    }
  } else {
    registry.set_grad_ready_hook([this](const Parameter& p) { on_grad_ready(p); });
    // A bucket's gradients take memory when the backward first reaches one of its parameters.
    registry.set_before_backward_hook(
        [this](const Parameter& p) { registry_->acquire_grads(layout_.param_bucket[p.index]); });
  }
  if (config_.overlap_param_gather)
    registry.set_before_forward_hook([this](const Parameter& p) { on_before_forward(p); });
}

DistributedDataParallel::~DistributedDataParallel() {
  registry_->set_grad_ready_hook({});
  registry_->set_before_forward_hook({});
  registry_->set_after_forward_hook({});
  registry_->set_before_backward_hook({});
  // Handles still in flight wait as they are destroyed (comm.h).
}

const RankShards& DistributedDataParallel::shards() const {
  MEGATRON_CHECK(config_.use_distributed_optimizer, "bucket shards exist only with the distributed optimizer");
  return shards_;
}

void DistributedDataParallel::zero_grad() {
  for (size_t b = 0; b < grad_work_.size(); ++b)
    MEGATRON_CHECK(grad_work_[b] == nullptr,
                   "zero_grad() while the reduction of bucket " << b << " is in flight; call finish_grad_sync() first");
  if (fsdp_) {
    registry_->zero_grads_lazily();
    fsdp_->zero_grad();
  } else {
    for (size_t b = 0; b < layout_.buckets.size(); ++b) registry_->release_grads(b);
  }
  std::fill(param_ready_.begin(), param_ready_.end(), false);
  std::fill(bucket_ready_.begin(), bucket_ready_.end(), 0);
  std::fill(bucket_started_.begin(), bucket_started_.end(), false);
}

void DistributedDataParallel::on_grad_ready(const Parameter& p) {
  if (!last_micro_batch_ || !(config_.overlap_grad_reduce || config_.release_weights_after_backward)) return;
  MEGATRON_CHECK(!param_ready_[p.index], p.spec.name << " was reported ready twice in one backward pass; "
                                                     << "each parameter's gradient is final once");
  param_ready_[p.index] = true;
  const size_t b = layout_.param_bucket[p.index];
  if (++bucket_ready_[b] < layout_.buckets[b].params.size()) return;
  if (config_.overlap_grad_reduce) start_bucket(b);
  if (config_.release_weights_after_backward) registry_->release_params(b);
}

void DistributedDataParallel::start_bucket(size_t b) {
  MEGATRON_CHECK(!bucket_started_[b], "bucket " << b << " was started twice in one step");
  registry_->acquire_grads(b);                                 // zeroed if no backward reached the bucket in this step
  registry_->zero_unwritten_grads(layout_.buckets[b].params);  // no gradient this step: zero
  const Range range = layout_.buckets[b].range;
  Tensor grads = registry_->grad_slice(range.begin, range.end);
  Communicator& group = layout_.buckets[b].expert_parallel ? *expert_group_ : *group_;
  // 1/DP for expert buckets too (see ddp.h).
  const int64_t R = group_->size();
  if (R > 1) ops::scale(grads, grads, float(1.0 / double(R)));
  if (config_.use_distributed_optimizer) {
    const Range shard = shards_.in_buffer[b];
    Tensor out = registry_->grad_slice(shard.begin, shard.end);
    grad_work_[b] = group.reduce_scatter_async(out, grads, ReduceOp::sum);
  } else {
    grad_work_[b] = group.all_reduce_async(grads, ReduceOp::sum);
  }
  bucket_started_[b] = true;
  // MPI advances non-blocking collectives only inside MPI calls: poll the earlier ones.
  for (const CommHandlePtr& work : grad_work_)
    if (work) work->test();
}

void DistributedDataParallel::finish_grad_sync() {
  if (fsdp_) {
    fsdp_->finish_grad_sync();
    return;
  }
  for (size_t b = 0; b < layout_.buckets.size(); ++b)
    if (!bucket_started_[b]) start_bucket(b);
  for (CommHandlePtr& work : grad_work_) {
    work->wait();
    work.reset();
  }
}

int64_t DistributedDataParallel::buckets_started() const {
  return std::count(bucket_started_.begin(), bucket_started_.end(), true);
}

void DistributedDataParallel::start_param_gather() {
  MEGATRON_CHECK(config_.use_distributed_optimizer, "parameter all-gather without the distributed optimizer");
  if (config_.shard_params) {  // each module's use gathers its bucket
    fsdp_->release_gathered_params();
    return;
  }
  const size_t buckets = layout_.buckets.size();
  for (size_t b = 0; b < buckets; ++b)
    MEGATRON_CHECK(!param_gather_pending_[b], "parameter all-gather of bucket "
                                                  << b << " started again before it was waited for; call "
                                                  << "finish_param_gather() before the next optimizer step");
  param_gather_events_.clear();
  std::fill(param_gather_pending_.begin(), param_gather_pending_.end(), true);
  // In forward order: the last bucket holds the first parameters registered.
  if (config_.overlap_param_gather) {
    start_param_gather_of(buckets - 1, std::nullopt);
  } else {
    for (size_t b = buckets; b-- > 0;) start_param_gather_of(b, std::nullopt);
  }
}

void DistributedDataParallel::finish_param_gather() {
  if (config_.shard_params) return;
  for (size_t b = layout_.buckets.size(); b-- > 0;)
    if (param_gather_pending_[b] && !param_work_[b]) start_param_gather_of(b, std::nullopt);
  for (size_t b = layout_.buckets.size(); b-- > 0;)
    if (param_gather_pending_[b]) wait_param_gather_of(b, std::nullopt);
}

// Megatron's forward pre-hook: wait for the bucket holding p (starting it first if the forward
// reached it out of order), then start the next bucket the forward will read.
void DistributedDataParallel::on_before_forward(const Parameter& p) {
  const size_t b = layout_.param_bucket[p.index];
  if (!param_gather_pending_[b]) return;
  if (!param_work_[b]) start_param_gather_of(b, p.index);
  wait_param_gather_of(b, p.index);
  if (b > 0 && param_gather_pending_[b - 1] && !param_work_[b - 1]) start_param_gather_of(b - 1, p.index);
}

void DistributedDataParallel::start_param_gather_of(size_t b, std::optional<size_t> param) {
  const Range range = layout_.buckets[b].range, shard = shards_.in_buffer[b];
  Tensor full = registry_->param_slice(range.begin, range.end);
  const Tensor mine = registry_->param_slice(shard.begin, shard.end);
  Communicator& group = layout_.buckets[b].expert_parallel ? *expert_group_ : *group_;
  param_work_[b] = group.all_gather_async(full, mine);
  param_gather_events_.push_back({ParamGatherEvent::Kind::start, b, param});
}

void DistributedDataParallel::wait_param_gather_of(size_t b, std::optional<size_t> param) {
  param_work_[b]->wait();
  param_work_[b].reset();
  param_gather_pending_[b] = false;
  param_gather_events_.push_back({ParamGatherEvent::Kind::wait, b, param});
}

Tensor DistributedDataParallel::grad_shard(size_t bucket) const {
  if (fsdp_) return fsdp_->grad_shard(bucket);
  const Range r = shards().in_buffer[bucket];
  return registry_->grad_slice(r.begin, r.end);
}

Tensor DistributedDataParallel::grad_of(const ShardParamRange& r) const {
  if (fsdp_) return fsdp_->grad_of(r);
  return registry_->grad_slice(r.in_buffer.begin, r.in_buffer.end);
}

Tensor DistributedDataParallel::param_of(const ShardParamRange& r) const {
  if (config_.shard_params) return fsdp_->param_of(r);
  return registry_->param_slice(r.in_buffer.begin, r.in_buffer.end);
}

std::vector<Tensor> DistributedDataParallel::sequence_parallel_grads() const {
  std::vector<Tensor> grads;
  if (fsdp_) {
    for (const ShardParamRange& r : shards_.params)
      if (registry_->params()[r.param]->spec.sequence_parallel) grads.push_back(fsdp_->grad_of(r));
  } else {
    for (const auto& p : registry_->params())
      if (p->spec.sequence_parallel) grads.push_back(p->main_grad);
  }
  return grads;
}

HeldBytes DistributedDataParallel::held_bytes() const {
  if (fsdp_) return fsdp_->held_bytes();
  int64_t grads = 0;  // from the backward to the step (between steps none)
  for (const Tensor& part : registry_->grad_buffers()) grads += int64_t(part.nbytes());
  int64_t weights = 0;
  for (const Tensor& part : registry_->param_buffers()) weights += int64_t(part.nbytes());
  return {weights, weights, grads, grads};
}

}  // namespace megatron
