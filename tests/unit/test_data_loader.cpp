// The background loader: Megatron's pretraining-sampler order per data-parallel rank, resume,
// exhaustion, worker errors and shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/datasets/data_loader.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::datasets;
using megatron::testing::error_of;

namespace {

// Sample i is [i, i + 1, ..., i + S]; index `fail_at` throws, as a damaged file would.
class CountingSource final : public SampleSource {
 public:
  CountingSource(int64_t size, int64_t seq_length, int64_t fail_at = -1)
      : size_(size), seq_length_(seq_length), fail_at_(fail_at) {}
  int64_t size() const override { return size_; }
  int64_t sample_length() const override { return seq_length_ + 1; }
  void read(int64_t index, int32_t* out) const override {
    ++reads;
    MEGATRON_CHECK(index != fail_at_, "sample " << index << " is unreadable");
    for (int64_t t = 0; t <= seq_length_; ++t) out[t] = int32_t(index + t);
  }
  mutable std::atomic<int64_t> reads{0};

 private:
  int64_t size_, seq_length_, fail_at_;
};

std::vector<int32_t> first_tokens(const Batch& batch) {
  std::vector<int32_t> out;
  const int64_t s = batch.tokens.dim(1);
  for (int64_t row = 0; row < batch.tokens.dim(0); ++row) out.push_back(batch.tokens.data<int32_t>()[row * s]);
  return out;
}

DataLoaderOptions options(int64_t mbs, int64_t dp, int64_t rank, int64_t consumed = 0, int64_t prefetch = 2) {
  DataLoaderOptions o;
  o.micro_batch_size = mbs;
  o.data_parallel_size = dp;
  o.data_parallel_rank = rank;
  o.consumed_samples = consumed;
  o.prefetch = prefetch;
  return o;
}

}  // namespace

TEST(DataLoader, RanksTakeTheirSliceOfEachChunk) {
  const CountingSource source(103, 3);
  const int64_t mbs = 2;
  for (int64_t dp : {1, 2, 4}) {
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int64_t r = 0; r < dp; ++r) ranks.push_back(std::make_unique<DataLoader>(source, options(mbs, dp, r)));
    const int64_t chunks = 103 / (mbs * dp);  // the final partial chunk is dropped
    EXPECT_EQ(ranks[0]->num_micro_batches(), chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t r = 0; r < dp; ++r) {
        const std::optional<Batch> batch = ranks[size_t(r)]->next();
        ASSERT_TRUE(batch) << "dp " << dp << " chunk " << c << " rank " << r;
        // Direct indexing: chunk c covers [c*mbs*dp, (c+1)*mbs*dp); rank r takes its r-th mbs.
        const int64_t first = c * mbs * dp + r * mbs;
        EXPECT_EQ(first_tokens(*batch), (std::vector<int32_t>{int32_t(first), int32_t(first + 1)}));
        const Batch direct = make_batch(source, std::vector<int64_t>{first, first + 1}, BatchOptions{});
        EXPECT_EQ(batch->labels.to_vector(), direct.labels.to_vector());
      }
    }
    for (auto& rank : ranks) {
      EXPECT_FALSE(rank->next());
      EXPECT_EQ(rank->consumed_samples(), chunks * mbs * dp);
    }
  }
}

TEST(DataLoader, ResumesWithTheNextSample) {
  const CountingSource source(64, 2);
  DataLoader fresh(source, options(2, 2, 1));
  std::vector<std::vector<int32_t>> all;
  while (auto batch = fresh.next()) all.push_back(first_tokens(*batch));
  ASSERT_EQ(all.size(), 16u);
  // A checkpoint taken after 5 global batches of 4 micro-batches... here 5 chunks of mbs*DP = 4.
  DataLoader resumed(source, options(2, 2, 1, 5 * 4));
  EXPECT_EQ(resumed.consumed_samples(), 20);
  for (size_t c = 5; c < all.size(); ++c) {
    const std::optional<Batch> batch = resumed.next();
    ASSERT_TRUE(batch);
    EXPECT_EQ(first_tokens(*batch), all[c]);
  }
  EXPECT_FALSE(resumed.next());
  EXPECT_EQ(resumed.consumed_samples(), 64);
}

TEST(DataLoader, SynchronousModeGivesTheSameBatches) {
  const CountingSource source(30, 4);
  DataLoader threaded(source, options(3, 2, 0, 6, 2)), inline_loader(source, options(3, 2, 0, 6, 0));
  while (auto batch = threaded.next()) {
    const std::optional<Batch> same = inline_loader.next();
    ASSERT_TRUE(same);
    EXPECT_EQ(batch->tokens.to_vector(), same->tokens.to_vector());
  }
  EXPECT_FALSE(inline_loader.next());
}

TEST(DataLoader, WorkerErrorsReachTheConsumerInOrder) {
  const CountingSource source(40, 2, /*fail_at=*/9);
  DataLoader loader(source, options(2, 1, 0));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(loader.next()) << i;  // samples 0..7 are fine
  EXPECT_NE(error_of([&] { loader.next(); }).find("sample 9 is unreadable"), std::string::npos);
  EXPECT_NE(error_of([&] { loader.next(); }).find("sample 9 is unreadable"), std::string::npos);
  EXPECT_EQ(loader.consumed_samples(), 8);
}

TEST(DataLoader, PrefetchIsBoundedAndShutdownIsClean) {
  const CountingSource source(1000, 2);
  {
    DataLoader loader(source, options(1, 1, 0, 0, 3));
    ASSERT_TRUE(loader.next());
    // The worker refills to 3 ready batches and then waits; destruction must not hang on it.
    for (int spin = 0; spin < 2000 && source.reads < 4; ++spin)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(source.reads, 4);  // one delivered + three prefetched, never more
  const DataLoader untouched(source, options(1, 1, 0));
}

TEST(DataLoader, RejectsBadOptions) {
  const CountingSource source(10, 2);
  EXPECT_NE(error_of([&] { DataLoader(source, options(2, 2, 2)); }).find("rank 2 must lie in [0, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(source, options(2, 1, 0, 11)); }).find("consumed samples 11 exceed"),
            std::string::npos);
  DataLoader finished(source, options(2, 1, 0, 10));  // a run resumed at its very end
  EXPECT_FALSE(finished.next());
  EXPECT_NE(error_of([&] { DataLoader(source, options(0, 1, 0)); }).find("--micro-batch-size 0"), std::string::npos);
}
