// The caching allocator's large-block bookkeeping (cuda_runtime/block_pool.h) on made-up
// addresses: best fit, splitting, merging with free neighbours only within a segment, streams kept
// apart, whole free segments handed back, a long random run against a brute-force model, the
// segment sizes, and replays of a training run's large requests under both segment rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "megatron/cuda_runtime/block_pool.h"
#include "test_util.h"

namespace megatron::cuda {
namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr BlockPool::StreamKey kCompute = 1, kSide = 2;

TEST(BlockPool, SplitsASegmentAndMergesItBackWhenFreed) {
  BlockPool pool;
  pool.add_segment(0x1000000, 10 * MiB, kCompute);
  const auto a = pool.allocate(3 * MiB, kCompute);
  const auto b = pool.allocate(4 * MiB, kCompute);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 0x1000000u);
  EXPECT_EQ(*b, 0x1000000u + 3 * MiB) << "the remainder of the split serves the next request";
  EXPECT_EQ(pool.block_bytes(*a), 3 * MiB);
  EXPECT_EQ(pool.free_bytes(), 3 * MiB);
  EXPECT_FALSE(pool.allocate(4 * MiB, kCompute)) << "3 MiB free: a 4 MiB request needs a new segment";
  EXPECT_EQ(pool.release(*a), 3 * MiB);
  EXPECT_EQ(pool.free_blocks(), 2u) << "a's block and the tail are not neighbours";
  EXPECT_EQ(pool.release(*b), 4 * MiB);
  EXPECT_EQ(pool.free_blocks(), 1u) << "b merges with both neighbours";
  EXPECT_EQ(pool.free_bytes(), 10 * MiB);
  EXPECT_EQ(*pool.allocate(10 * MiB, kCompute), 0x1000000u) << "the whole segment again";
}

TEST(BlockPool, TakesTheSmallestFreeBlockThatFits) {
  BlockPool pool;
  pool.add_segment(0x10000000, 8 * MiB, kCompute);
  pool.add_segment(0x20000000, 5 * MiB, kCompute);
  pool.add_segment(0x30000000, 6 * MiB, kCompute);
  EXPECT_EQ(*pool.allocate(5 * MiB, kCompute), 0x20000000u);
  EXPECT_EQ(*pool.allocate(5 * MiB + 512, kCompute), 0x30000000u);
  EXPECT_EQ(pool.block_bytes(0x30000000), 6 * MiB) << "a remainder below 1 MiB is not split off";
  EXPECT_EQ(*pool.allocate(MiB, kCompute), 0x10000000u);
}

TEST(BlockPool, NeverMergesAcrossSegmentsOrHandsOutAnotherStreamsMemory) {
  BlockPool pool;
  pool.add_segment(0x1000000, 2 * MiB, kCompute);
  pool.add_segment(0x1000000 + 2 * MiB, 2 * MiB, kCompute);  // adjacent addresses, two segments
  const auto a = pool.allocate(2 * MiB, kCompute), b = pool.allocate(2 * MiB, kCompute);
  ASSERT_TRUE(a && b);
  pool.release(*a);
  pool.release(*b);
  EXPECT_EQ(pool.free_blocks(), 2u);
  EXPECT_FALSE(pool.allocate(3 * MiB, kCompute)) << "two 2 MiB segments are not one 4 MiB block";
  EXPECT_FALSE(pool.allocate(MiB, kSide)) << "the compute stream's blocks are not the side stream's";
  pool.add_segment(0x9000000, 2 * MiB, kSide);
  EXPECT_EQ(*pool.allocate(MiB, kSide), 0x9000000u);
}

TEST(BlockPool, HandsBackOnlyWholeFreeSegments) {
  BlockPool pool;
  pool.add_segment(0x1000000, 4 * MiB, kCompute);
  pool.add_segment(0x2000000, 4 * MiB, kCompute);
  const auto held = pool.allocate(4 * MiB, kCompute);
  const auto part = pool.allocate(2 * MiB, kCompute);
  ASSERT_TRUE(held && part);
  pool.release(*part);
  const std::vector<BlockPool::Segment> taken = pool.take_free_segments();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].base, *part);
  EXPECT_EQ(taken[0].bytes, 4 * MiB);
  EXPECT_EQ(pool.reserved_bytes(), 4 * MiB);
  EXPECT_EQ(pool.free_bytes(), 0u);
  EXPECT_TRUE(pool.holds(*held));
}

TEST(BlockPool, ReleaseOfForeignMemoryIsAnError) {
  BlockPool pool;
  pool.add_segment(0x1000000, 4 * MiB, kCompute);
  EXPECT_NE(testing::error_of([&] { pool.release(0x1000000); }).find("did not hand out"), std::string::npos)
      << "a free block is not a handed-out one";
  EXPECT_NE(testing::error_of([&] { pool.release(0x5); }).find("did not hand out"), std::string::npos);
}

// Random allocations and frees against a model that knows which bytes are in use: blocks never
// overlap, stay inside their stream's segments, and the pool's free bytes are the segments' bytes
// minus the used blocks' (nothing leaks through splitting and merging). Freeing everything leaves
// one free block per segment.
TEST(BlockPool, RandomUseKeepsBlocksDisjointAndMergesEverythingBack) {
  BlockPool pool;
  std::mt19937_64 rng(7);
  std::map<BlockPool::Address, std::pair<size_t, BlockPool::StreamKey>> used;  // address -> (bytes, stream)
  std::map<BlockPool::Address, std::pair<size_t, BlockPool::StreamKey>> segments;
  BlockPool::Address next_segment = 0x100000000;
  for (int step = 0; step < 5000; ++step) {
    const BlockPool::StreamKey stream = rng() % 4 == 0 ? kSide : kCompute;
    if (used.empty() || rng() % 3 != 0) {
      const size_t bytes = (1 + rng() % 64) * MiB / 4 + (rng() % 2) * 512;
      auto at = pool.allocate(bytes, stream);
      if (!at) {
        const size_t segment = (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB) + (rng() % 3) * 2 * MiB;
        pool.add_segment(next_segment, segment, stream);
        segments[next_segment] = {segment, stream};
        next_segment += segment;  // adjacent segments: merging must still respect their bounds
        at = pool.allocate(bytes, stream);
      }
      ASSERT_TRUE(at);
      const size_t got = pool.block_bytes(*at);
      ASSERT_GE(got, bytes);
      ASSERT_LT(got - bytes, BlockPool::kMinSplit);
      auto seg = segments.upper_bound(*at);
      ASSERT_NE(seg, segments.begin());
      --seg;
      ASSERT_EQ(seg->second.second, stream) << "a block of another stream's segment";
      ASSERT_LE(*at + got, seg->first + seg->second.first) << "a block past its segment's end";
      auto after = used.lower_bound(*at);
      if (after != used.end()) {
        ASSERT_LE(*at + got, after->first) << "overlap";
      }
      if (after != used.begin()) {
        auto before = std::prev(after);
        ASSERT_LE(before->first + before->second.first, *at) << "overlap";
      }
      used[*at] = {got, stream};
    } else {
      auto victim = used.begin();
      std::advance(victim, rng() % used.size());
      ASSERT_EQ(pool.release(victim->first), victim->second.first);
      used.erase(victim);
    }
    size_t in_use = 0;
    for (const auto& [at, block] : used) in_use += block.first;
    ASSERT_EQ(pool.free_bytes() + in_use, pool.reserved_bytes()) << "step " << step;
  }
  for (const auto& [at, block] : used) pool.release(at);
  EXPECT_EQ(pool.free_blocks(), segments.size());
  EXPECT_EQ(pool.take_free_segments().size(), segments.size());
  EXPECT_EQ(pool.reserved_bytes(), 0u);
}

// The CUDA allocator's large requests (allocator.cu) on made-up addresses: a free block of the
// stream, else a new segment of `segment_for(block)` bytes (the device having room).
class CachingAllocatorReplay {
 public:
  explicit CachingAllocatorReplay(size_t (*segment_for)(size_t)) : segment_for_(segment_for) {}
  BlockPool::Address take(size_t bytes) {
    bytes = (bytes + 511) / 512 * 512;
    std::optional<BlockPool::Address> at = pool_.allocate(bytes, kCompute);
    if (!at) {
      const size_t segment = segment_for_(bytes);
      pool_.add_segment(next_, segment, kCompute);
      next_ += segment + BlockPool::kSegmentGranularity;  // the driver's segments need not be adjacent
      at = pool_.allocate(bytes, kCompute);
    }
    in_use_ += pool_.block_bytes(*at);
    peak_ = std::max(peak_, in_use_);
    return *at;
  }
  void give(BlockPool::Address at) { in_use_ -= pool_.release(at); }
  size_t reserved_above_peak() const { return pool_.reserved_bytes() - peak_; }

 private:
  size_t (*segment_for_)(size_t);
  BlockPool pool_;
  BlockPool::Address next_ = BlockPool::Address(1) << 40;
  size_t in_use_ = 0, peak_ = 0;
};

struct Llama3bRun {
  bool setup_takes_the_buckets = false;  // DDP before f5a57be
  bool released_weights = false;         // DdpConfig::release_weights_after_backward
  size_t (*segment_for)(size_t) = BlockPool::segment_bytes;
};

// llama-3b's BF16 run (bench/train_runs.sh, micro-batch 2; the log's 5367 MiB of weights, 10735 of
// main gradients and 3 x 10735 of optimizer state): the set-up's large requests in the order the
// registry, DDP and AdamW make them, then four steps (26 layers' activations kept from the
// forward to their backward, the gradients in 160 MiB buckets taken as the backward reaches them,
// given back at the next zero_grad; with released weights, the weights in 80 MiB parts, one per
// bucket, given back once the backward has passed their bucket, and taken again in the step,
// each just before its bucket's gradients are given back). Returns the reserved bytes above the peak.
size_t llama_3b_reserved_above_peak(const Llama3bRun& run) {
  constexpr size_t weights = 5367 * MiB, fp32 = 10735 * MiB, bucket = 160 * MiB, buckets = 67, layers = 26;
  constexpr size_t tokens = 4096, hidden = 3072, ffn = 8192, vocab = 32000;
  CachingAllocatorReplay gpu(run.segment_for);
  const BlockPool::Address first_weights = gpu.take(weights);  // ParameterRegistry::allocate
  gpu.give(gpu.take(fp32));                                    // its gradients, dropped by DDP's layout
  BlockPool::Address laid_out = gpu.take(weights);             // set_layout's buffers
  gpu.give(first_weights);
  gpu.give(gpu.take(fp32));  // the flat gradients split_grads drops
  std::vector<BlockPool::Address> weight_parts;
  if (run.released_weights) {  // split_params, then the flat buffer goes
    for (size_t b = 0; b < buckets; ++b) weight_parts.push_back(gpu.take(bucket / 2));
    gpu.give(laid_out);
  }
  std::vector<BlockPool::Address> grads;
  if (run.setup_takes_the_buckets)
    for (size_t b = 0; b < buckets; ++b) grads.push_back(gpu.take(bucket));
  for (int state = 0; state < 3; ++state) gpu.take(fp32);  // masters, exp_avg, exp_avg_sq
  const std::vector<size_t> activations = {tokens * hidden * 2,  tokens * hidden * 2, tokens * (hidden + 2048) * 2,
                                           tokens * hidden * 2,  tokens * hidden * 2, tokens * hidden * 2,
                                           tokens * 2 * ffn * 2, tokens * ffn * 2};
  for (int step = 0; step < 4; ++step) {
    for (BlockPool::Address b : grads) gpu.give(b);  // zero_grad (with released weights: the step gave them back)
    grads.clear();
    std::vector<std::vector<BlockPool::Address>> kept(layers);
    for (auto& layer : kept)
      for (size_t bytes : activations) layer.push_back(gpu.take(bytes));
    gpu.give(gpu.take(tokens * vocab * 4));  // the logits' gradient
    size_t released = 0;
    for (size_t layer = layers; layer-- > 0;) {
      while (grads.size() < (layers - layer) * buckets / layers) grads.push_back(gpu.take(bucket));
      const BlockPool::Address input_grad = gpu.take(tokens * hidden * 2);
      for (BlockPool::Address a : kept[layer]) gpu.give(a);
      gpu.give(input_grad);
      if (run.released_weights)  // every bucket before the last one reached is complete
        for (; released + 1 < grads.size() || (layer == 0 && released < buckets); ++released)
          gpu.give(weight_parts[released]);
    }
    if (!run.released_weights) continue;
    for (size_t b = 0; b < buckets; ++b) {  // Optimizer::update_parts
      weight_parts[b] = gpu.take(bucket / 2);
      gpu.give(grads[b]);
    }
    grads.clear();
  }
  return gpu.reserved_above_peak();
}

// Buckets taken at the set-up and given back at the first zero_grad leave a hole of every
// gradient's size beside the optimizer state allocated in between: 10380 MiB above the peak here
// with segments of each request's size, where the H100 reserved 57.67 GiB against a peak of 47.73
// (9.94 GiB above; PERFORMANCE.md). Released from the start (DDP now), 1244 MiB (the H100: 50.09
// against 47.73, 2.36 GiB above).
TEST(BlockPool, ReplayOfATrainingRunsSetUpKeepsLittleAboveItsPeak) {
  const size_t taking =
      llama_3b_reserved_above_peak({.setup_takes_the_buckets = true, .segment_for = BlockPool::fitting_segment_bytes});
  const size_t released = llama_3b_reserved_above_peak({.segment_for = BlockPool::fitting_segment_bytes});
  EXPECT_GT(taking, 9 * 1024 * MiB) << taking / MiB;
  EXPECT_LT(released, 2 * 1024 * MiB) << released / MiB;
}

// Weights released from their bucket's last backward to the step: with segments of each request's
// size the 80 MiB parts the backward frees serve its smaller transients, and the step's parts then
// come from the gradients' 160 MiB segments, which the next backward cannot use whole: 6411 MiB
// above the peak here (the H100: 53.88 GiB reserved against a peak of 44.99, 8.9 above). From
// segments of at least 1 GiB, where freed neighbours merge, 599 MiB (not yet measured on a GPU).
TEST(BlockPool, ReleasedWeightsNeedSegmentsWhereFreedNeighboursMerge) {
  const size_t own_size =
      llama_3b_reserved_above_peak({.released_weights = true, .segment_for = BlockPool::fitting_segment_bytes});
  const size_t preferred = llama_3b_reserved_above_peak({.released_weights = true});
  EXPECT_GT(own_size, 5 * 1024 * MiB) << own_size / MiB << " MiB: the replay no longer shows the problem";
  EXPECT_LT(preferred, 1024 * MiB) << preferred / MiB << " MiB above the peak";
}

TEST(BlockPool, SegmentSizes) {
  EXPECT_EQ(BlockPool::fitting_segment_bytes(MiB + 512), 2 * MiB);
  EXPECT_EQ(BlockPool::fitting_segment_bytes(5 * MiB), 6 * MiB);
  EXPECT_EQ(BlockPool::segment_bytes(5 * MiB), BlockPool::kPreferredSegment);
  EXPECT_EQ(BlockPool::segment_bytes(BlockPool::kPreferredSegment + 1), BlockPool::kPreferredSegment + 2 * MiB);
}

}  // namespace
}  // namespace megatron::cuda
