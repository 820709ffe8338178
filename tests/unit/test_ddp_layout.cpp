// Bucket and shard range arithmetic (distributed/buffer_layout.h) against hand-computed tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "megatron/distributed/buffer_layout.h"
#include "megatron/distributed/ddp.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {
std::vector<size_t> indices(std::initializer_list<size_t> v) { return v; }
}  // namespace

// Registration order p0 (10), p1 (20), p2 (5); laid out backwards with 16-element starts:
//   p2 [0,5)  p1 [16,36)  p0 [48,58), one unpadded bucket.
TEST(DdpLayout, OneBucketReverseOrderWithoutDistributedOptimizer) {
  const BufferLayout l = make_buffer_layout({10, 20, 5}, {.shard_group_size = 4});
  EXPECT_EQ(l.params, (std::vector<Range>{{48, 58}, {16, 36}, {0, 5}}));
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 58}));
  EXPECT_EQ(l.buckets[0].numel_unpadded, 58);
  EXPECT_EQ(l.buckets[0].params, indices({2, 1, 0}));
  EXPECT_EQ(l.numel, 58);
  EXPECT_EQ(l.param_offsets(), (std::vector<int64_t>{48, 16, 0}));
}

// bucket_size 20: p1 ends at 36 >= 20, closing bucket 0 = [0,36); p0 starts the next one at 36
// and sits at 48 after alignment: bucket 1 = [36,58).
TEST(DdpLayout, BucketClosesOnceItReachesTheSize) {
  const BufferLayout l = make_buffer_layout({10, 20, 5}, {.shard_group_size = 2, .bucket_size = 20});
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 36}));
  EXPECT_EQ(l.buckets[0].params, indices({2, 1}));
  EXPECT_EQ(l.buckets[1].range, (Range{36, 58}));
  EXPECT_EQ(l.buckets[1].numel_unpadded, 22);
  EXPECT_EQ(l.buckets[1].params, indices({0}));
  EXPECT_EQ(l.param_bucket, (std::vector<size_t>{1, 0, 0}));
  EXPECT_EQ(l.params[0], (Range{48, 58}));
}

// Megatron FSDP's units as bucket groups: p0 and p1 are one module, p2 another; laid out backwards, the bucket
// closes where the module changes (whatever the size): p2 [0,5) | p1 [16,36) p0 [48,58). With the
// distributed optimizer at R = 2 each bucket pads to 128: p2 [0,5) -> [0,128) | p1 [128,148)
// p0 [192,202) -> [128,256).
TEST(DdpLayout, FsdpUnitsCloseBucketsWhereTheModuleChanges) {
  const BufferLayout l = make_buffer_layout({10, 20, 5}, {.shard_group_size = 2, .bucket_group = {0, 0, 1}});
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 5}));
  EXPECT_EQ(l.buckets[0].params, indices({2}));
  EXPECT_EQ(l.buckets[1].range, (Range{5, 58}));
  EXPECT_EQ(l.buckets[1].params, indices({1, 0}));
  EXPECT_EQ(l.params, (std::vector<Range>{{48, 58}, {16, 36}, {0, 5}}));
  const BufferLayout d =
      make_buffer_layout({10, 20, 5}, {.shard_group_size = 2, .distributed_optimizer = true, .bucket_group = {0, 0, 1}});
  ASSERT_EQ(d.buckets.size(), 2u);
  EXPECT_EQ(d.buckets[0].range, (Range{0, 128}));
  EXPECT_EQ(d.buckets[1].range, (Range{128, 256}));
  EXPECT_EQ(d.params, (std::vector<Range>{{192, 202}, {128, 148}, {0, 5}}));
  EXPECT_NE(error_of([] {
              make_buffer_layout({10, 20, 5}, {.bucket_group = {0, 1}});
            }).find("bucket groups for 2 parameters"),
            std::string::npos);
}

// The units of a model's parameters, from their Megatron names: the embedding, each decoder layer,
// the final norm (under "decoder") and the output layer.
TEST(DdpLayout, FsdpUnitsFollowTheMegatronNames) {
  ParameterRegistry registry;
  for (const char* name :
       {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
        "decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.1.self_attention.linear_qkv.weight", "decoder.final_layernorm.weight",
        "decoder.final_layernorm.bias", "output_layer.weight", "decoder.layers.10.mlp.linear_fc2.weight"})
    registry.add({.name = name, .global_shape = {4}});
  EXPECT_EQ(fsdp_units(registry), (std::vector<int64_t>{0, 0, 1, 1, 2, 3, 3, 4, 5}));
}

// Expert-parallel parameters p1 (20) and p3 (30) get buckets of their own after the dense ones,
// each part laid out backwards: p2 [0,5) p0 [16,26) | p3 [32,62) p1 [64,84).
// With the distributed optimizer (64-element starts) each part pads to its own group: the dense
// bucket to lcm(3,128) = 384, the expert one (expert DP 1) to 128:
//   p2 [0,5) p0 [64,74) -> [0,384) | p3 [384,414) p1 [448,468) -> [384,512).
// Shards: the dense bucket in thirds by DP rank, the expert bucket by expert-DP rank.
TEST(DdpLayout, ExpertParallelParametersGetTheirOwnBuckets) {
  const std::vector<bool> expert = {false, true, false, true};
  const BufferLayout l = make_buffer_layout({10, 20, 5, 30}, {.shard_group_size = 3, .expert_parallel = expert});
  EXPECT_EQ(l.params, (std::vector<Range>{{16, 26}, {64, 84}, {0, 5}, {32, 62}}));
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 26}));
  EXPECT_EQ(l.buckets[0].params, indices({2, 0}));
  EXPECT_FALSE(l.buckets[0].expert_parallel);
  EXPECT_EQ(l.buckets[1].range, (Range{26, 84}));
  EXPECT_EQ(l.buckets[1].params, indices({3, 1}));
  EXPECT_TRUE(l.buckets[1].expert_parallel);
  EXPECT_EQ(l.param_bucket, (std::vector<size_t>{0, 1, 0, 1}));

  const BufferLayout d = make_buffer_layout(
      {10, 20, 5, 30},
      {.shard_group_size = 3, .distributed_optimizer = true, .expert_parallel = expert, .expert_shard_group_size = 1});
  EXPECT_EQ(d.params, (std::vector<Range>{{64, 74}, {448, 468}, {0, 5}, {384, 414}}));
  ASSERT_EQ(d.buckets.size(), 2u);
  EXPECT_EQ(d.buckets[0].range, (Range{0, 384}));
  EXPECT_EQ(d.buckets[1].range, (Range{384, 512}));
  EXPECT_EQ(d.buckets[1].numel_unpadded, 84);
  EXPECT_EQ(d.numel, 512);
  // DP rank 2 of 3 owns the dense shard [256,384); expert-DP rank 0 of 1 the whole expert bucket.
  const RankShards r2 = rank_shards(d, 2, 0);
  EXPECT_EQ(r2.in_buffer, (std::vector<Range>{{256, 384}, {384, 512}}));
  EXPECT_EQ(r2.numel, 256);
  EXPECT_NE(error_of([&] { rank_shards(d, 2); }).find("outside the expert-data-parallel group of 1"),
            std::string::npos);
}

// FP8 parameters (--fp8-param-gather) p1 (20) and p3 (30) get buckets of their own after the
// others, so each bucket is gathered in one dtype; with the distributed optimizer (R = 2, 64-element
// starts, buckets padded to 128): p2 [0,5) p0 [64,74) -> [0,128) | p3 [128,158) p1 [192,212) -> [128,256).
TEST(DdpLayout, Fp8ParametersGetTheirOwnBuckets) {
  const std::vector<bool> fp8 = {false, true, false, true};
  const BufferLayout d =
      make_buffer_layout({10, 20, 5, 30}, {.shard_group_size = 2, .distributed_optimizer = true, .fp8 = fp8});
  EXPECT_EQ(d.params, (std::vector<Range>{{64, 74}, {192, 212}, {0, 5}, {128, 158}}));
  ASSERT_EQ(d.buckets.size(), 2u);
  EXPECT_EQ(d.buckets[0].range, (Range{0, 128}));
  EXPECT_EQ(d.buckets[0].params, indices({2, 0}));
  EXPECT_FALSE(d.buckets[0].fp8);
  EXPECT_EQ(d.buckets[1].range, (Range{128, 256}));
  EXPECT_EQ(d.buckets[1].params, indices({3, 1}));
  EXPECT_TRUE(d.buckets[1].fp8);
  // A bucket size (40) closes buckets within each kind: p2 [0,5) p0 [16,26) end the other pass in
  // a bucket of 26; then p4 [32,82), p3 [96,126) and p1 [128,148) each fill one (56, 44, 22).
  const BufferLayout small =
      make_buffer_layout({10, 20, 5, 30, 50}, {.bucket_size = 40, .fp8 = {false, true, false, true, true}});
  ASSERT_EQ(small.buckets.size(), 4u);
  EXPECT_EQ(small.buckets[0].params, indices({2, 0}));
  EXPECT_FALSE(small.buckets[0].fp8);
  EXPECT_EQ(small.buckets[1].params, indices({4}));
  EXPECT_EQ(small.buckets[2].params, indices({3}));
  EXPECT_EQ(small.buckets[3].params, indices({1}));
  EXPECT_TRUE(small.buckets[1].fp8 && small.buckets[2].fp8 && small.buckets[3].fp8);
  EXPECT_NE(error_of([&] {
              make_buffer_layout({10, 20}, {.fp8 = {true}});
            }).find("FP8 flags for 1 parameters, but 2"),
            std::string::npos);
}

// Distributed optimizer, R = 2: 64-element starts and the bucket end padded to lcm(2,128) = 128.
//   p2 (30) [0,30)  p1 (150) [64,214)  p0 (100) [256,356); bucket [0,384), shards of 192.
// Rank 0 owns [0,192): p2 whole, p1's first 128 elements. Rank 1 owns [192,384): p1's last 22,
// p0 whole, then padding.
TEST(DdpLayout, DistributedOptimizerShardsCutParameters) {
  const BufferLayout l = make_buffer_layout({100, 150, 30}, {.shard_group_size = 2, .distributed_optimizer = true});
  EXPECT_EQ(l.params, (std::vector<Range>{{256, 356}, {64, 214}, {0, 30}}));
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 384}));
  EXPECT_EQ(l.buckets[0].numel_unpadded, 356);

  const RankShards r0 = rank_shards(l, 0);
  EXPECT_EQ(r0.in_buffer, (std::vector<Range>{{0, 192}}));
  EXPECT_EQ(r0.numel, 192);
  ASSERT_EQ(r0.params.size(), 2u);
  EXPECT_EQ(r0.params[0].param, 2u);
  EXPECT_EQ(r0.params[0].in_param, (Range{0, 30}));
  EXPECT_EQ(r0.params[0].in_shards, (Range{0, 30}));
  EXPECT_EQ(r0.params[1].param, 1u);
  EXPECT_EQ(r0.params[1].in_param, (Range{0, 128}));
  EXPECT_EQ(r0.params[1].in_buffer, (Range{64, 192}));
  EXPECT_EQ(r0.params[1].in_shards, (Range{64, 192}));

  const RankShards r1 = rank_shards(l, 1);
  EXPECT_EQ(r1.in_buffer, (std::vector<Range>{{192, 384}}));
  ASSERT_EQ(r1.params.size(), 2u);
  EXPECT_EQ(r1.params[0].param, 1u);
  EXPECT_EQ(r1.params[0].in_param, (Range{128, 150}));
  EXPECT_EQ(r1.params[0].in_buffer, (Range{192, 214}));
  EXPECT_EQ(r1.params[0].in_bucket, (Range{192, 214}));
  EXPECT_EQ(r1.params[0].in_shards, (Range{0, 22}));
  EXPECT_EQ(r1.params[1].param, 0u);
  EXPECT_EQ(r1.params[1].in_param, (Range{0, 100}));
  EXPECT_EQ(r1.params[1].in_shards, (Range{64, 164}));
}

// R = 3 (lcm(3,128) = 384), bucket_size 100: p2 (40) [0,40) and p1 (200) [64,264) fill bucket 0
// = [0,384); p0 (50) [384,434) opens bucket 1 = [384,768). Shards: 128 elements per bucket.
//   rank 0: bucket 0 [0,128) -> p2 [0,40), p1 [0,64);  bucket 1 [384,512) -> p0 whole.
//   rank 2: bucket 0 [256,384) -> p1 [192,200);         bucket 1 [640,768) -> padding only.
TEST(DdpLayout, DistributedOptimizerShardsEveryBucket) {
  const BufferLayout l =
      make_buffer_layout({50, 200, 40}, {.shard_group_size = 3, .bucket_size = 100, .distributed_optimizer = true});
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].range, (Range{0, 384}));
  EXPECT_EQ(l.buckets[0].numel_unpadded, 264);
  EXPECT_EQ(l.buckets[1].range, (Range{384, 768}));
  EXPECT_EQ(l.buckets[1].numel_unpadded, 50);
  EXPECT_EQ(l.numel, 768);

  const RankShards r0 = rank_shards(l, 0);
  EXPECT_EQ(r0.in_buffer, (std::vector<Range>{{0, 128}, {384, 512}}));
  EXPECT_EQ(r0.in_shards, (std::vector<Range>{{0, 128}, {128, 256}}));
  ASSERT_EQ(r0.params.size(), 3u);
  EXPECT_EQ(r0.params[1].param, 1u);
  EXPECT_EQ(r0.params[1].in_param, (Range{0, 64}));
  EXPECT_EQ(r0.params[2].param, 0u);
  EXPECT_EQ(r0.params[2].bucket, 1u);
  EXPECT_EQ(r0.params[2].in_bucket, (Range{0, 50}));
  EXPECT_EQ(r0.params[2].in_shards, (Range{128, 178}));

  const RankShards r2 = rank_shards(l, 2);
  EXPECT_EQ(r2.in_buffer, (std::vector<Range>{{256, 384}, {640, 768}}));
  ASSERT_EQ(r2.params.size(), 1u);
  EXPECT_EQ(r2.params[0].in_param, (Range{192, 200}));
  EXPECT_EQ(r2.params[0].in_bucket, (Range{256, 264}));
  EXPECT_EQ(r2.params[0].in_shards, (Range{0, 8}));
  EXPECT_EQ(r2.numel, 256);
}

// Every element of every parameter is owned by exactly one rank, for several sizes.
TEST(DdpLayout, ShardsTileEveryParameterOnce) {
  const std::vector<int64_t> numels = {3, 1000, 17, 64, 129, 4096, 1};
  for (int64_t R : {1, 2, 3, 4, 8})
    for (int64_t bucket : {0, 100, 2000}) {
      const BufferLayout l =
          make_buffer_layout(numels, {.shard_group_size = R, .bucket_size = bucket, .distributed_optimizer = true});
      std::vector<int64_t> covered(numels.size(), 0);
      for (int64_t r = 0; r < R; ++r)
        for (const ShardParamRange& p : rank_shards(l, r).params) covered[p.param] += p.in_param.size();
      EXPECT_EQ(covered, numels) << "R " << R << " bucket " << bucket;
      for (const BucketLayout& b : l.buckets) EXPECT_EQ(b.range.size() % std::lcm(R, int64_t(128)), 0);
    }
}

TEST(DdpLayout, MegatronDefaultBucketSize) {
  EXPECT_EQ(default_ddp_bucket_size(1), 40000000);
  EXPECT_EQ(default_ddp_bucket_size(40), 40000000);
  EXPECT_EQ(default_ddp_bucket_size(64), 64000000);
}

TEST(DdpLayout, UnpaddedBucketsCannotBeSharded) {
  const BufferLayout l = make_buffer_layout({11, 5}, {.shard_group_size = 2});  // p1 [0,5), p0 [16,27)
  EXPECT_NE(error_of([&] { rank_shards(l, 0); }).find("does not split into 2 equal shards"), std::string::npos);
  EXPECT_NE(error_of([&] { rank_shards(l, 2); }).find("outside the data-parallel group of 2"), std::string::npos);
}

// Bucket groups (DDP: each model chunk's own buckets, the shared embedding alone), distributed
// optimizer, R = 2, bucket ends padded to lcm(2, 128) = 128. Two pipeline stages hold the tied
// embedding (300 elements, group -1) among other parameters:
//   stage A registers emb, c0 (100), c1 (50), c1 (40): [40 at 0, 50 at 64 | pad 128] [100 at 128
//     | pad 256] [emb at 256 | pad 640];
//   stage B registers c0 (30), emb, c1 (90): [90 at 0 | pad 128] [emb at 128 | pad 512] [30 at 512
//     | pad 640].
// The embedding's bucket holds 384 elements on both, so DP rank r's shard covers the same
// elements of it, [192 r, 192 (r+1)) cut at 300: the embedding group may sum reduced shards.
TEST(DdpLayout, BucketGroupsNeverShareABucketAndTheSharedEmbeddingShardsAlike) {
  const BufferLayoutOptions common{.shard_group_size = 2, .distributed_optimizer = true};
  BufferLayoutOptions a = common, b = common;
  a.bucket_group = {-1, 0, 1, 1};
  b.bucket_group = {0, -1, 1};
  const BufferLayout la = make_buffer_layout({300, 100, 50, 40}, a);
  const BufferLayout lb = make_buffer_layout({30, 300, 90}, b);
  ASSERT_EQ(la.buckets.size(), 3u);
  EXPECT_EQ(la.buckets[0].range, (Range{0, 128}));
  EXPECT_EQ(la.buckets[0].params, indices({3, 2}));
  EXPECT_EQ(la.buckets[1].range, (Range{128, 256}));
  EXPECT_EQ(la.buckets[2].range, (Range{256, 640}));
  EXPECT_EQ(la.buckets[2].params, indices({0}));
  ASSERT_EQ(lb.buckets.size(), 3u);
  EXPECT_EQ(lb.buckets[1].range, (Range{128, 512}));
  EXPECT_EQ(lb.buckets[1].params, indices({1}));
  for (int64_t r = 0; r < 2; ++r) {
    auto embedding_part = [r](const BufferLayout& l, size_t param) {
      for (const ShardParamRange& p : rank_shards(l, r).params)
        if (p.param == param) return p.in_param;
      return Range{};
    };
    const Range want{192 * r, std::min<int64_t>(192 * (r + 1), 300)};
    EXPECT_EQ(embedding_part(la, 0), want) << "stage A, rank " << r;
    EXPECT_EQ(embedding_part(lb, 1), want) << "stage B, rank " << r;
  }
  // Without groups the same parameters share buckets.
  EXPECT_EQ(make_buffer_layout({300, 100, 50, 40}, common).buckets.size(), 1u);
  EXPECT_NE(error_of([&] {
              BufferLayoutOptions bad = common;
              bad.bucket_group = {0};
              make_buffer_layout({300, 100}, bad);
            }).find("bucket groups for 1 parameters"),
            std::string::npos);
}
