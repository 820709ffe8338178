#include "megatron/distributed/buffer_layout.h"

#include <algorithm>
#include <numeric>

#include "megatron/core/error.h"
#include "megatron/parameters/parameter_registry.h"

namespace megatron {

namespace {
constexpr int64_t kDistOptParamAlignment = 64;  // Megatron's, with the distributed optimizer
constexpr int64_t kDistOptBucketMultiple = 128;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

std::vector<int64_t> BufferLayout::param_offsets() const {
  std::vector<int64_t> offsets;
  for (const Range& r : params) offsets.push_back(r.begin);
  return offsets;
}

BufferLayout make_buffer_layout(const std::vector<int64_t>& param_numels, const BufferLayoutOptions& options) {
  MEGATRON_CHECK(options.shard_group_size >= 1,
                 "data-parallel group size " << options.shard_group_size << " must be at least 1");
  MEGATRON_CHECK(options.bucket_size >= 0,
                 "--ddp-bucket-size " << options.bucket_size << " must be >= 0 (0: Megatron's default)");
  MEGATRON_CHECK(options.expert_parallel.empty() || options.expert_parallel.size() == param_numels.size(),
                 "expert_parallel flags for " << options.expert_parallel.size() << " parameters, but "
                                              << param_numels.size() << " parameters");
  MEGATRON_CHECK(options.bucket_group.empty() || options.bucket_group.size() == param_numels.size(),
                 "bucket groups for " << options.bucket_group.size() << " parameters, but " << param_numels.size()
                                      << " parameters");
  MEGATRON_CHECK(options.fp8.empty() || options.fp8.size() == param_numels.size(),
                 "FP8 flags for " << options.fp8.size() << " parameters, but " << param_numels.size() << " parameters");
  MEGATRON_CHECK(options.expert_shard_group_size >= 1,
                 "expert-data-parallel group size " << options.expert_shard_group_size << " must be at least 1");
  const int64_t align = options.distributed_optimizer ? kDistOptParamAlignment : kParamAlignment;
  const auto bucket_multiple = [&](bool expert) {
    const int64_t R = expert ? options.expert_shard_group_size : options.shard_group_size;
    return options.distributed_optimizer ? std::lcm(R, kDistOptBucketMultiple) : int64_t(1);
  };
  const auto is_expert = [&](size_t i) { return !options.expert_parallel.empty() && options.expert_parallel[i]; };
  const auto is_fp8 = [&](size_t i) { return !options.fp8.empty() && options.fp8[i]; };
  const auto group = [&](size_t i) { return options.bucket_group.empty() ? 0 : options.bucket_group[i]; };
  BufferLayout layout;
  layout.shard_group_size = options.shard_group_size;
  layout.expert_shard_group_size = options.expert_shard_group_size;
  layout.params.resize(param_numels.size());
  layout.param_bucket.resize(param_numels.size());

  BucketLayout bucket;
  int64_t bucket_start = 0, param_start = 0, param_end = 0;
  // Closes the open bucket at param_end, padding its end; returns where the next one starts.
  const auto close_bucket = [&] {
    bucket.range = {bucket_start, round_up(param_end, bucket_multiple(bucket.expert_parallel))};
    bucket.numel_unpadded = param_end - bucket_start;
    bucket_start = bucket.range.end;
    layout.buckets.push_back(std::move(bucket));
    bucket = {};
    return bucket_start;
  };
  for (const bool expert : {false, true})
    for (const bool fp8 : {false, true}) {
      std::vector<size_t> order;  // this kind's parameters in buffer order
      for (size_t i = param_numels.size(); i-- > 0;)
        if (is_expert(i) == expert && is_fp8(i) == fp8) order.push_back(i);
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        MEGATRON_CHECK(param_numels[i] > 0, "parameter " << i << " has " << param_numels[i] << " elements");
        if (!bucket.params.empty() && group(bucket.params.back()) != group(i)) param_start = close_bucket();
        bucket.expert_parallel = expert;
        bucket.fp8 = fp8;
        param_start = round_up(param_start, align);
        param_end = param_start + param_numels[i];
        layout.params[i] = {param_start, param_end};
        layout.param_bucket[i] = layout.buckets.size();
        bucket.params.push_back(i);
        const bool full = options.bucket_size > 0 && param_end - bucket_start >= options.bucket_size;
        param_start = full ? close_bucket() : param_end;
      }
      if (!bucket.params.empty()) param_start = close_bucket();
    }
  layout.numel = bucket_start;
  return layout;
}

RankShards rank_shards(const BufferLayout& layout, int64_t rank, int64_t expert_rank) {
  RankShards out;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const BucketLayout& bucket = layout.buckets[b];
    const int64_t R = bucket.expert_parallel ? layout.expert_shard_group_size : layout.shard_group_size;
    const int64_t r = bucket.expert_parallel ? expert_rank : rank;
    MEGATRON_CHECK(0 <= r && r < R, "rank " << r << " is outside the " << (bucket.expert_parallel ? "expert-" : "")
                                            << "data-parallel group of " << R);
    MEGATRON_CHECK(bucket.range.size() % R == 0, "bucket " << b << " of " << bucket.range.size()
                                                           << " elements does not split into " << R
                                                           << " equal shards; build the layout with "
                                                           << "distributed_optimizer, which pads buckets");
    const int64_t shard = bucket.range.size() / R;
    const Range world{bucket.range.begin + r * shard, bucket.range.begin + (r + 1) * shard};
    const Range local{out.numel, out.numel + shard};
    out.in_buffer.push_back(world);
    out.in_shards.push_back(local);
    for (size_t i : bucket.params) {
      const Range& p = layout.params[i];
      const int64_t lo = std::max(p.begin, world.begin), hi = std::min(p.end, world.end);
      if (lo >= hi) continue;
      out.params.push_back({.param = i,
                            .bucket = b,
                            .in_param = {lo - p.begin, hi - p.begin},
                            .in_buffer = {lo, hi},
                            .in_bucket = {lo - bucket.range.begin, hi - bucket.range.begin},
                            .in_shards = {local.begin + lo - world.begin, local.begin + hi - world.begin}});
    }
    out.numel += shard;
  }
  return out;
}

}  // namespace megatron
