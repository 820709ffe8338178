#pragma once
// Where parameters and buckets live in the flat param/grad buffers under data parallelism, and
// which piece of each bucket a rank owns under the distributed optimizer (Megatron's
// param_and_grad_buffer and distrib_optimizer ranges, reference/megatron-compat.md §9).
// Pure arithmetic on element counts, tested against hand-computed tables.
//
// Layout: parameters in reverse registration order (the order backward finishes them), so the
// first bucket is complete first. A bucket closes once it holds >= bucket_size elements.
//   - without the distributed optimizer: each parameter starts at a multiple of 16 elements
//     (our vector-load alignment; Megatron packs them with no gap); buckets are not padded;
//   - with it: each parameter starts at a multiple of 64 elements and each bucket's end is
//     padded to a multiple of lcm(R, 128), R = the sharding group's size, so the bucket splits
//     into R equal shards. Rank r owns shard r of every bucket, cutting parameters anywhere.
// A bucket also closes before a parameter of another bucket group (options.bucket_group).
// Expert-parallel parameters (MoE experts, split over EP) are reduced over the expert-data-parallel
// group instead, so they get buckets of their own after the dense ones (Megatron keeps them in a
// separate buffer), padded for that group's size. FP8 parameters (--fp8-param-gather) get buckets of
// their own after the others of their kind (Megatron keeps a buffer per parameter dtype), so a
// bucket's parameters are gathered in one dtype.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace megatron {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

struct BufferLayoutOptions {
  int64_t shard_group_size = 1;  // R: the data-parallel (DP x CP) group
  int64_t bucket_size = 0;       // elements; 0: one bucket for the whole buffer
  bool distributed_optimizer = false;
  std::vector<bool> expert_parallel = {};  // per parameter, registration order; empty: none is
  int64_t expert_shard_group_size = 1;     // the expert-data-parallel group
  // Per parameter, registration order: parameters of different groups never share a bucket (DDP:
  // each model chunk's buckets its own, the shared embedding alone; Megatron FSDP: each module's
  // bucket its own, gathered one at a time); empty: one group.
  std::vector<int64_t> bucket_group = {};
  std::vector<bool> fp8 = {};  // per parameter, registration order: held in FP8; empty: none is
};

struct BucketLayout {
  Range range;                   // in the buffer; its end is padded
  int64_t numel_unpadded = 0;    // up to the end of its last parameter
  std::vector<size_t> params;    // registration indices, in buffer order
  bool expert_parallel = false;  // holds expert-parallel parameters only (reduced over expert DP)
  bool fp8 = false;              // holds FP8 parameters only
};

struct BufferLayout {
  std::vector<Range> params;          // per parameter, in registration order
  std::vector<size_t> param_bucket;   // per parameter
  std::vector<BucketLayout> buckets;  // in buffer order
  int64_t numel = 0;
  int64_t shard_group_size = 1;
  int64_t expert_shard_group_size = 1;

  // Element offset of every parameter, for ParameterRegistry::set_layout.
  std::vector<int64_t> param_offsets() const;
};

// param_numels: local element counts in registration order.
BufferLayout make_buffer_layout(const std::vector<int64_t>& param_numels, const BufferLayoutOptions& options);

// The part of one parameter inside a rank's shard (Megatron's four ranges of a param).
struct ShardParamRange {
  size_t param = 0;  // registration index
  size_t bucket = 0;
  Range in_param;   // within the flattened parameter ("param")
  Range in_buffer;  // in the whole buffer ("gbuf_world")
  Range in_bucket;  // relative to the bucket's start ("gbuf_world_in_bucket")
  Range in_shards;  // in the concatenation of this rank's shards of all buckets (its state buffers)
};

struct RankShards {
  std::vector<Range> in_buffer;         // shard of each bucket, in the buffer
  std::vector<Range> in_shards;         // the same shards in the concatenation
  std::vector<ShardParamRange> params;  // in buffer order
  int64_t numel = 0;                    // sum of the shard sizes
};

// Rank `rank`'s shard of every bucket of a layout built with distributed_optimizer; of the
// expert-parallel buckets, shard `expert_rank` of the expert-data-parallel group (-1: the layout
// has none).
RankShards rank_shards(const BufferLayout& layout, int64_t rank, int64_t expert_rank = -1);

}  // namespace megatron
